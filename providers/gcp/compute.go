package gcp

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/googleapis/gax-go/v2"
	"github.com/googleapis/gax-go/v2/callctx"
	"google.golang.org/api/option"
	"google.golang.org/api/option/internaloption"
	htransport "google.golang.org/api/transport/http"
	"google.golang.org/protobuf/proto"
)

// computeAPI is the provider's whole view of the Compute Engine API: each call is one HTTP
// request for one page, so that the provider can count, gate and bound every request.
type computeAPI interface {
	// listManagedInstances returns one page of the MIG's managed instances.
	listManagedInstances(ctx context.Context, pageToken string) (items []*computepb.ManagedInstance, next string, err error)
	// listInstances returns one page of the zone's instances that match filter.
	listInstances(ctx context.Context, zone, filter, pageToken string) (items []*computepb.Instance, next string, err error)

	// The capacity calls (capacity.go).

	// getGroup reads the MIG itself (instanceGroupManagers.get): targetSize, currentActions,
	// status.autoscaler.
	getGroup(ctx context.Context) (*computepb.InstanceGroupManager, error)
	// getAutoscaler reads the MIG's autoscaler by name, in the MIG's zone or region.
	getAutoscaler(ctx context.Context, name string) (*computepb.Autoscaler, error)
	// resize sets the MIG's targetSize. It returns the operation as the API first answered it.
	resize(ctx context.Context, size int32, requestID string) (*compute.Operation, error)
	// recreate recreates one instance (a partial URL, zones/Z/instances/N) from the group's
	// current template, its targetSize unchanged.
	recreate(ctx context.Context, instance, requestID string) (*compute.Operation, error)
	// pollOperation asks once for the operation's state (zoneOperations.get or
	// regionOperations.get); op.Proto() is then the answer.
	pollOperation(ctx context.Context, op *compute.Operation) error
	// listErrors returns one page of the MIG's errors (instanceGroupManagers.listErrors).
	listErrors(ctx context.Context, pageToken string) (items []*computepb.InstanceManagedByIgmError, next string, err error)

	Close() error
}

// pageSize is the API's largest page (maxResults is at most 500). A MIG whose
// listManagedInstancesResults is PAGELESS (the default) ignores it and answers in one page.
const pageSize = 500

// The fields each list asks for (X-Goog-FieldMask, the header form of the standard `fields`
// parameter): an instance resource is several KiB, of which a host needs a few hundred bytes.
const (
	managedFields  = "managedInstances(id,instance,name,currentAction,instanceStatus),nextPageToken"
	instanceFields = "items(id,name,zone,status,machineType,creationTimestamp," +
		"networkInterfaces(networkIP,ipv6Address),scheduling(provisioningModel,preemptible)," +
		"guestAccelerators(acceleratorCount)),nextPageToken"
)

// noRetry turns off the SDK's own retry (503/504 for instance lists, every few hundred
// milliseconds until the context ends, without reading Retry-After): the provider answers
// throttling itself, per endpoint, and the discovery watcher is the one that retries.
var noRetry = gax.WithRetry(func() gax.Retryer { return nil })

// sdkAPI is computeAPI over the real SDK's REST clients.
type sdkAPI struct {
	project, zone, region, mig string
	calls                      *callTransport

	zonal     *compute.InstanceGroupManagersClient       // a zonal MIG's, else nil
	regional  *compute.RegionInstanceGroupManagersClient // a regional MIG's, else nil
	instances *compute.InstancesClient

	// The autoscaler clients are made by the first getAutoscaler: most groups have none.
	zonalAS    *compute.AutoscalersClient
	regionalAS *compute.RegionAutoscalersClient
	opts       []option.ClientOption // the clients' options, for those made later
}

// computeDefaults are the options the SDK's compute clients give themselves, for the one
// authenticated HTTP client that newSDKAPI makes for all of them.
func computeDefaults() []option.ClientOption {
	return []option.ClientOption{
		internaloption.WithDefaultEndpoint("https://compute.googleapis.com"),
		internaloption.WithDefaultEndpointTemplate("https://compute.UNIVERSE_DOMAIN"),
		internaloption.WithDefaultMTLSEndpoint("https://compute.mtls.googleapis.com"),
		internaloption.WithDefaultUniverseDomain("googleapis.com"),
		internaloption.WithDefaultAudience("https://compute.googleapis.com/"),
		internaloption.WithDefaultScopes(compute.DefaultAuthScopes()...),
		internaloption.EnableNewAuthLibrary(),
	}
}

// newSDKAPI makes the REST clients. Credentials are found here (Application Default
// Credentials unless cfg.ClientOptions say otherwise), which is why the first poll does it
// and not New: finding them may ask the metadata server whether this is a GCE VM.
//
// The clients share one HTTP client, made here rather than by the SDK so that it can put
// each request under its caller's context (see callTransport). The clients outlive the poll
// that makes them, so they are made under a context that the poll's end does not cancel.
func newSDKAPI(ctx context.Context, cfg Config) (*sdkAPI, error) {
	ctx = context.WithoutCancel(ctx)
	var endpoint []option.ClientOption
	if cfg.Endpoint != "" {
		endpoint = append(endpoint, option.WithEndpoint(cfg.Endpoint))
	}
	hc, _, err := htransport.NewClient(ctx, slices.Concat(computeDefaults(), endpoint, cfg.ClientOptions)...)
	if err != nil {
		return nil, err
	}
	calls := &callTransport{base: hc.Transport, ctxs: map[string]context.Context{}}
	if calls.base == nil {
		calls.base = http.DefaultTransport
	}
	opts := append(endpoint, option.WithHTTPClient(&http.Client{Transport: calls}))
	a := &sdkAPI{project: cfg.Project, zone: cfg.Zone, region: cfg.Region, mig: cfg.MIG, calls: calls, opts: opts}
	if cfg.Zone != "" {
		a.zonal, err = compute.NewInstanceGroupManagersRESTClient(ctx, opts...)
	} else {
		a.regional, err = compute.NewRegionInstanceGroupManagersRESTClient(ctx, opts...)
	}
	if err != nil {
		return nil, err
	}
	if a.instances, err = compute.NewInstancesRESTClient(ctx, opts...); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// callTransport puts each request back under the context of the call that made it. The
// SDK's paginated REST methods (every method with an iterator, in compute v1.75.0) build
// their requests without the caller's context, so a poll whose context ends would leave its
// request running for as long as the server takes. Each call is tagged with a header that
// callctx passes through to the request; the transport maps it back to the call's context
// and removes it.
type callTransport struct {
	base http.RoundTripper

	mu   sync.Mutex
	next uint64
	ctxs map[string]context.Context // by tag, while the call runs
}

// callHeader is the tag's header; callctx writes header names in lower case.
const callHeader = "x-elasticd-call"

// tag returns ctx carrying a new tag, and the function that forgets it.
func (t *callTransport) tag(ctx context.Context) (context.Context, func()) {
	t.mu.Lock()
	t.next++
	id := strconv.FormatUint(t.next, 10)
	t.ctxs[id] = ctx
	t.mu.Unlock()
	return callctx.SetHeaders(ctx, callHeader, id), func() {
		t.mu.Lock()
		delete(t.ctxs, id)
		t.mu.Unlock()
	}
}

func (t *callTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ids := req.Header[callHeader]
	if ids == nil {
		ids = req.Header[http.CanonicalHeaderKey(callHeader)]
	}
	if len(ids) == 0 {
		return t.base.RoundTrip(req)
	}
	t.mu.Lock()
	ctx := t.ctxs[ids[0]]
	t.mu.Unlock()
	if ctx == nil {
		ctx = req.Context()
	}
	r := req.Clone(ctx) // a RoundTripper must not change the caller's request
	delete(r.Header, callHeader)
	r.Header.Del(callHeader)
	return t.base.RoundTrip(r)
}

// The SDK's iterators fetch pages on their own and skip empty pages in an unbounded loop; the
// iterator's InternalFetch is the one-request-per-page call underneath, which is what this
// seam needs (the SDK version is pinned in go.mod, and the tests exercise it).

func (a *sdkAPI) listManagedInstances(ctx context.Context, pageToken string) ([]*computepb.ManagedInstance, string, error) {
	ctx, done := a.calls.tag(callctx.SetHeaders(ctx, "X-Goog-FieldMask", managedFields))
	defer done()
	var it *compute.ManagedInstanceIterator
	if a.zonal != nil {
		it = a.zonal.ListManagedInstances(ctx, &computepb.ListManagedInstancesInstanceGroupManagersRequest{
			Project: a.project, Zone: a.zone, InstanceGroupManager: a.mig,
		}, noRetry)
	} else {
		it = a.regional.ListManagedInstances(ctx, &computepb.ListManagedInstancesRegionInstanceGroupManagersRequest{
			Project: a.project, Region: a.region, InstanceGroupManager: a.mig,
		}, noRetry)
	}
	return it.InternalFetch(pageSize, pageToken)
}

func (a *sdkAPI) listInstances(ctx context.Context, zone, filter, pageToken string) ([]*computepb.Instance, string, error) {
	ctx, done := a.calls.tag(callctx.SetHeaders(ctx, "X-Goog-FieldMask", instanceFields))
	defer done()
	req := &computepb.ListInstancesRequest{Project: a.project, Zone: zone}
	if filter != "" {
		req.Filter = proto.String(filter)
	}
	return a.instances.List(ctx, req, noRetry).InternalFetch(pageSize, pageToken)
}

func (a *sdkAPI) Close() error {
	var errs []error
	if a.zonal != nil {
		errs = append(errs, a.zonal.Close())
	}
	if a.regional != nil {
		errs = append(errs, a.regional.Close())
	}
	if a.instances != nil {
		errs = append(errs, a.instances.Close())
	}
	if a.zonalAS != nil {
		errs = append(errs, a.zonalAS.Close())
	}
	if a.regionalAS != nil {
		errs = append(errs, a.regionalAS.Close())
	}
	return errors.Join(errs...)
}

// The capacity calls. Each is one HTTP request: the SDK's retry is off (noRetry), as for the
// lists, and the provider's loop paces and retries them.

func (a *sdkAPI) getGroup(ctx context.Context) (*computepb.InstanceGroupManager, error) {
	if a.zonal != nil {
		return a.zonal.Get(ctx, &computepb.GetInstanceGroupManagerRequest{
			Project: a.project, Zone: a.zone, InstanceGroupManager: a.mig,
		}, noRetry)
	}
	return a.regional.Get(ctx, &computepb.GetRegionInstanceGroupManagerRequest{
		Project: a.project, Region: a.region, InstanceGroupManager: a.mig,
	}, noRetry)
}

func (a *sdkAPI) getAutoscaler(ctx context.Context, name string) (*computepb.Autoscaler, error) {
	// Made under the context of no call, like the other clients: they outlive this one.
	mk := context.WithoutCancel(ctx)
	var err error
	if a.zonal != nil {
		if a.zonalAS == nil {
			if a.zonalAS, err = compute.NewAutoscalersRESTClient(mk, a.opts...); err != nil {
				return nil, err
			}
		}
		return a.zonalAS.Get(ctx, &computepb.GetAutoscalerRequest{Project: a.project, Zone: a.zone, Autoscaler: name}, noRetry)
	}
	if a.regionalAS == nil {
		if a.regionalAS, err = compute.NewRegionAutoscalersRESTClient(mk, a.opts...); err != nil {
			return nil, err
		}
	}
	return a.regionalAS.Get(ctx, &computepb.GetRegionAutoscalerRequest{Project: a.project, Region: a.region, Autoscaler: name}, noRetry)
}

func (a *sdkAPI) resize(ctx context.Context, size int32, requestID string) (*compute.Operation, error) {
	if a.zonal != nil {
		return a.zonal.Resize(ctx, &computepb.ResizeInstanceGroupManagerRequest{
			Project: a.project, Zone: a.zone, InstanceGroupManager: a.mig, Size: size, RequestId: proto.String(requestID),
		}, noRetry)
	}
	return a.regional.Resize(ctx, &computepb.ResizeRegionInstanceGroupManagerRequest{
		Project: a.project, Region: a.region, InstanceGroupManager: a.mig, Size: size, RequestId: proto.String(requestID),
	}, noRetry)
}

func (a *sdkAPI) recreate(ctx context.Context, instance, requestID string) (*compute.Operation, error) {
	if a.zonal != nil {
		return a.zonal.RecreateInstances(ctx, &computepb.RecreateInstancesInstanceGroupManagerRequest{
			Project: a.project, Zone: a.zone, InstanceGroupManager: a.mig, RequestId: proto.String(requestID),
			InstanceGroupManagersRecreateInstancesRequestResource: &computepb.InstanceGroupManagersRecreateInstancesRequest{
				Instances: []string{instance},
			},
		}, noRetry)
	}
	return a.regional.RecreateInstances(ctx, &computepb.RecreateInstancesRegionInstanceGroupManagerRequest{
		Project: a.project, Region: a.region, InstanceGroupManager: a.mig, RequestId: proto.String(requestID),
		RegionInstanceGroupManagersRecreateRequestResource: &computepb.RegionInstanceGroupManagersRecreateRequest{
			Instances: []string{instance},
		},
	}, noRetry)
}

func (a *sdkAPI) pollOperation(ctx context.Context, op *compute.Operation) error {
	return op.Poll(ctx, noRetry)
}

func (a *sdkAPI) listErrors(ctx context.Context, pageToken string) ([]*computepb.InstanceManagedByIgmError, string, error) {
	ctx, done := a.calls.tag(ctx) // an iterator's request: see callTransport
	defer done()
	var it *compute.InstanceManagedByIgmErrorIterator
	if a.zonal != nil {
		it = a.zonal.ListErrors(ctx, &computepb.ListErrorsInstanceGroupManagersRequest{
			Project: a.project, Zone: a.zone, InstanceGroupManager: a.mig,
		}, noRetry)
	} else {
		it = a.regional.ListErrors(ctx, &computepb.ListErrorsRegionInstanceGroupManagersRequest{
			Project: a.project, Region: a.region, InstanceGroupManager: a.mig,
		}, noRetry)
	}
	return it.InternalFetch(pageSize, pageToken)
}
