package azure

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/authorization/armauthorization/v2"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
)

// api is the whole of what the provider asks of Azure Resource Manager. sdk is the only
// implementation; tests drive it against an in-process server that speaks ARM's JSON.
type api interface {
	// scaleSet is GET …/virtualMachineScaleSets/{vmss}: priority (spot), size, location.
	scaleSet(ctx context.Context) (armcompute.VirtualMachineScaleSet, error)
	// vms is GET …/virtualMachineScaleSets/{vmss}/virtualMachines?$expand=instanceView.
	vms() pages[*armcompute.VirtualMachineScaleSetVM]
	// nics is GET …/virtualMachineScaleSets/{vmss}/networkInterfaces: every VM's NICs in
	// one paged listing instead of one call per VM.
	nics() pages[*armnetwork.Interface]
	// setCapacity is PATCH …/virtualMachineScaleSets/{vmss} with {"sku":{"capacity":n}},
	// then the wait for its long-running operation (the scale-out or scale-in), polled
	// every when ARM names no Retry-After.
	setCapacity(ctx context.Context, n int64, every time.Duration) error
	// setTags is PATCH …/virtualMachineScaleSets/{vmss} with {"tags":{…}}, which replaces
	// the set's tags with these, then the wait for its long-running operation.
	setTags(ctx context.Context, tags map[string]*string, every time.Duration) error
	// deleteInstance is POST …/virtualMachineScaleSets/{vmss}/delete with
	// {"instanceIds":[id]}, then the wait for its long-running operation. ARM lowers
	// sku.capacity by one.
	deleteInstance(ctx context.Context, instanceID string, every time.Duration) error
	// token gets an access token for ARM from the provider's credential, as every call's
	// bearer token is got (check.go).
	token(ctx context.Context) (azcore.AccessToken, error)
	// permissions is GET …/virtualMachineScaleSets/{vmss}/providers/Microsoft.Authorization/
	// permissions: the caller's RBAC actions and notActions on the scale set (check.go).
	permissions() pages[*armauthorization.Permission]
}

// lroError is a long-running operation that ARM accepted and that then ended Failed (or
// Canceled): the request was valid, what it asked for was not (all) done. Its ResponseError
// is the operation's status resource, {"status":"Failed","error":{"code","message"}}.
type lroError struct{ re *azcore.ResponseError }

func (e *lroError) Error() string { return e.re.Error() }
func (e *lroError) Unwrap() error { return e.re }

// waited marks the failure of an LRO's wait that is the operation's own (a 2xx status
// resource that says Failed) as an lroError; a throttled or failed poll request, or an
// ended context, is left as it is.
func waited(err error) error {
	var re *azcore.ResponseError
	if errors.As(err, &re) && re.StatusCode >= 200 && re.StatusCode < 300 {
		return &lroError{re}
	}
	return err
}

// pages walks one paged listing.
type pages[T any] interface {
	More() bool
	// Next fetches the next page: its items and the link to the page after it ("" at the end).
	Next(ctx context.Context) (items []T, nextLink string, err error)
}

// sdk is api over the Azure SDK's clients.
type sdk struct {
	rg, vmss string
	sets     *armcompute.VirtualMachineScaleSetsClient
	vmc      *armcompute.VirtualMachineScaleSetVMsClient
	nicc     *armnetwork.InterfacesClient
	perms    *armauthorization.PermissionsClient
	cred     azcore.TokenCredential // as the clients have it
	scope    string                 // of the clients' tokens: the ARM audience's /.default
}

// SDK retry inside one request: a few quick tries for a transient failure, and Retry-After
// honoured up to Config.MaxRetryWait (retryContext lowers it to what the poll has left).
const (
	sdkRetries    = 2
	sdkRetryDelay = 500 * time.Millisecond
)

func newSDK(cfg Config, cred azcore.TokenCredential) (*sdk, error) {
	opts := &arm.ClientOptions{
		ClientOptions: policy.ClientOptions{
			Cloud: cloudFor(cfg.Endpoint),
			Retry: policy.RetryOptions{MaxRetries: sdkRetries, RetryDelay: sdkRetryDelay, MaxRetryDelay: cfg.MaxRetryWait},
		},
		// Registering resource providers needs write access and is never the fix for a read.
		DisableRPRegistration: true,
	}
	if cfg.Endpoint != "" {
		u, err := parseEndpoint(cfg.Endpoint)
		if err != nil {
			return nil, fmt.Errorf("--endpoint %q: %w", cfg.Endpoint, err)
		}
		opts.InsecureAllowCredentialWithHTTP = u.Scheme == "http" // loopback only, as checked
	}
	cred = credential{cred}
	sets, err := armcompute.NewVirtualMachineScaleSetsClient(cfg.Subscription, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("azure compute client: %w", err)
	}
	vmc, err := armcompute.NewVirtualMachineScaleSetVMsClient(cfg.Subscription, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("azure compute client: %w", err)
	}
	nicc, err := armnetwork.NewInterfacesClient(cfg.Subscription, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("azure network client: %w", err)
	}
	perms, err := armauthorization.NewPermissionsClient(cfg.Subscription, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("azure authorization client: %w", err)
	}
	// The scope the ARM pipeline asks its bearer tokens for (azcore's arm/runtime).
	scope := opts.Cloud.Services[cloud.ResourceManager].Audience + "/.default"
	return &sdk{rg: cfg.ResourceGroup, vmss: cfg.VMSS, sets: sets, vmc: vmc, nicc: nicc, perms: perms, cred: cred, scope: scope}, nil
}

// cloudFor is the cloud whose ARM endpoint is endpoint: a known sovereign cloud keeps its
// own token audience, any other endpoint is taken as the public cloud's ARM behind another
// address (a private endpoint, a test server).
func cloudFor(endpoint string) cloud.Configuration {
	if endpoint == "" {
		return cloud.AzurePublic
	}
	trim := func(s string) string { return strings.ToLower(strings.TrimRight(s, "/")) }
	for _, c := range []cloud.Configuration{cloud.AzurePublic, cloud.AzureGovernment, cloud.AzureChina} {
		if trim(c.Services[cloud.ResourceManager].Endpoint) == trim(endpoint) {
			return c
		}
	}
	c := cloud.AzurePublic
	rm := c.Services[cloud.ResourceManager]
	rm.Endpoint = strings.TrimRight(endpoint, "/")
	c.Services = map[cloud.ServiceName]cloud.ServiceConfiguration{cloud.ResourceManager: rm}
	return c
}

func (s *sdk) scaleSet(ctx context.Context) (armcompute.VirtualMachineScaleSet, error) {
	r, err := s.sets.Get(ctx, s.rg, s.vmss, nil)
	return r.VirtualMachineScaleSet, err
}

func (s *sdk) setCapacity(ctx context.Context, n int64, every time.Duration) error {
	update := armcompute.VirtualMachineScaleSetUpdate{SKU: &armcompute.SKU{Capacity: &n}}
	pl, err := s.sets.BeginUpdate(ctx, s.rg, s.vmss, update, nil)
	if err != nil {
		return err
	}
	_, err = pl.PollUntilDone(ctx, &runtime.PollUntilDoneOptions{Frequency: every})
	return waited(err)
}

func (s *sdk) setTags(ctx context.Context, tags map[string]*string, every time.Duration) error {
	if tags == nil {
		tags = map[string]*string{} // {"tags":{}} removes them all; no "tags" would change nothing
	}
	pl, err := s.sets.BeginUpdate(ctx, s.rg, s.vmss, armcompute.VirtualMachineScaleSetUpdate{Tags: tags}, nil)
	if err != nil {
		return err
	}
	_, err = pl.PollUntilDone(ctx, &runtime.PollUntilDoneOptions{Frequency: every})
	return waited(err)
}

func (s *sdk) deleteInstance(ctx context.Context, instanceID string, every time.Duration) error {
	ids := armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{&instanceID}}
	pl, err := s.sets.BeginDeleteInstances(ctx, s.rg, s.vmss, ids, nil)
	if err != nil {
		return err
	}
	_, err = pl.PollUntilDone(ctx, &runtime.PollUntilDoneOptions{Frequency: every})
	return waited(err)
}

func (s *sdk) token(ctx context.Context) (azcore.AccessToken, error) {
	return s.cred.GetToken(ctx, policy.TokenRequestOptions{Scopes: []string{s.scope}})
}

func (s *sdk) permissions() pages[*armauthorization.Permission] {
	// A scale set is a top-level resource of Microsoft.Compute: no parent path.
	return sdkPages[armauthorization.PermissionsClientListForResourceResponse, *armauthorization.Permission]{
		pager: s.perms.NewListForResourcePager(s.rg, "Microsoft.Compute", "", "virtualMachineScaleSets", s.vmss, nil),
		items: func(r armauthorization.PermissionsClientListForResourceResponse) ([]*armauthorization.Permission, *string) {
			return r.Value, r.NextLink
		},
	}
}

func (s *sdk) vms() pages[*armcompute.VirtualMachineScaleSetVM] {
	opts := &armcompute.VirtualMachineScaleSetVMsClientListOptions{Expand: to.Ptr("instanceView")}
	return sdkPages[armcompute.VirtualMachineScaleSetVMsClientListResponse, *armcompute.VirtualMachineScaleSetVM]{
		pager: s.vmc.NewListPager(s.rg, s.vmss, opts),
		items: func(r armcompute.VirtualMachineScaleSetVMsClientListResponse) ([]*armcompute.VirtualMachineScaleSetVM, *string) {
			return r.Value, r.NextLink
		},
	}
}

func (s *sdk) nics() pages[*armnetwork.Interface] {
	return sdkPages[armnetwork.InterfacesClientListVirtualMachineScaleSetNetworkInterfacesResponse, *armnetwork.Interface]{
		pager: s.nicc.NewListVirtualMachineScaleSetNetworkInterfacesPager(s.rg, s.vmss, nil),
		items: func(r armnetwork.InterfacesClientListVirtualMachineScaleSetNetworkInterfacesResponse) ([]*armnetwork.Interface, *string) {
			return r.Value, r.NextLink
		},
	}
}

// sdkPages adapts an SDK pager.
type sdkPages[R, T any] struct {
	pager *runtime.Pager[R]
	items func(R) ([]T, *string)
}

func (p sdkPages[R, T]) More() bool { return p.pager.More() }

func (p sdkPages[R, T]) Next(ctx context.Context) ([]T, string, error) {
	r, err := p.pager.NextPage(ctx)
	if err != nil {
		return nil, "", err
	}
	items, next := p.items(r)
	return items, deref(next), nil
}

// maxPages bounds one listing. A Uniform scale set holds at most 1,000 VMs, a few pages; a
// listing that goes on this long is an API handing out links in a loop.
const maxPages = 10_000

// walk reads every page of a listing through the endpoint's gate and hands each page to use
// before it fetches the next, so that no more than one page of SDK structs is held at a time.
// An error of use ends the walk and is returned as it is.
func walk[T any](ctx context.Context, p *Provider, op string, pg pages[T], use func([]T) error) error {
	seen := make(map[string]bool)
	for n := 0; pg.More(); n++ {
		if n == maxPages {
			return fmt.Errorf("more than %d pages: the API keeps returning a nextLink", maxPages)
		}
		var items []T
		var next string
		err := p.loop.Call(ctx, op, func(ctx context.Context) (err error) {
			items, next, err = pg.Next(p.retryContext(ctx))
			return err
		})
		if err != nil {
			return err
		}
		if items == nil { // ARM sends "value": [] for an empty page; an empty 200 decodes to nothing
			return fmt.Errorf("page %d has no \"value\" list: the response is malformed", n+1)
		}
		if err := use(items); err != nil {
			return err
		}
		if next != "" {
			if seen[next] {
				return fmt.Errorf("page %d links back to an earlier page (%s): the API is looping", n+1, next)
			}
			seen[next] = true
		}
	}
	return nil
}

// collect reads every page of a listing, through the endpoint's gate, and keeps every item:
// for the short listings (permissions).
func collect[T any](ctx context.Context, p *Provider, op string, pg pages[T]) ([]T, error) {
	var all []T
	if err := walk(ctx, p, op, pg, func(items []T) error {
		all = append(all, items...)
		return nil
	}); err != nil {
		return nil, err
	}
	return all, nil
}

// callOnce makes one unpaged call through the endpoint's gate.
func callOnce[T any](ctx context.Context, p *Provider, op string, call func(context.Context) (T, error)) (T, error) {
	var r T
	err := p.loop.Call(ctx, op, func(ctx context.Context) (err error) {
		r, err = call(p.retryContext(ctx))
		return err
	})
	return r, err
}

// retryContext caps the SDK's wait for a Retry-After by what is left of the poll: a wait the
// poll cannot outlive is not started, and the endpoint's gate remembers it instead.
func (p *Provider) retryContext(ctx context.Context) context.Context {
	wait := p.cfg.MaxRetryWait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl))
	}
	return policy.WithRetryOptions(ctx, policy.RetryOptions{
		MaxRetries:    sdkRetries,
		RetryDelay:    sdkRetryDelay,
		MaxRetryDelay: max(wait, time.Nanosecond), // 0 would mean the SDK's default, 60s
	})
}

// credential marks the errors of getting a token, so that they read as a credential
// problem rather than as whatever the last link of the credential chain said.
type credential struct{ azcore.TokenCredential }

func (c credential) GetToken(ctx context.Context, o policy.TokenRequestOptions) (azcore.AccessToken, error) {
	tk, err := c.TokenCredential.GetToken(ctx, o)
	if err != nil {
		return tk, &credentialError{err}
	}
	return tk, nil
}

type credentialError struct{ err error }

func (e *credentialError) Error() string { return e.err.Error() }
func (e *credentialError) Unwrap() error { return e.err }
