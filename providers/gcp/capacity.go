package gcp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/googleapi"

	"github.com/elasticd/elasticd/providers"
)

// Steering the MIG (providers.Capacity): its size from instanceGroupManagers.get, resize,
// recreateInstances for one instance, and listErrors for its launch failures; regional
// groups through the regionInstanceGroupManagers equivalents. Every request goes through the
// loop (one gate per endpoint, the "gcp: " prefix); a resize or a recreate is waited for
// until its operation is DONE, polling it between requests rather than holding the SDK
// clients, so that host polls go on meanwhile.

// The permissions each call needs, named in its refusal.
const (
	permGet        = "compute.instanceGroupManagers.get"
	permUpdate     = "compute.instanceGroupManagers.update"
	permAutoscaler = "compute.autoscalers.get"
)

const (
	// failureWindow is how far back LaunchFailures looks: the MIG keeps its errors for
	// longer, and the driver cares about the current attempts.
	failureWindow = time.Hour
	// maxErrorPages bounds one LaunchFailures (500 errors a page): a group stuck on a
	// stockout for days can hold many, and the API can neither filter nor order them.
	maxErrorPages = 20
	// An operation is asked about after opPollFirst, then at growing intervals up to
	// opPollMax, until it is DONE or the caller's context ends.
	opPollFirst = 250 * time.Millisecond
	opPollMax   = 5 * time.Second
)

// group is what GroupSize reads, and what SetDesired checks before a resize.
type group struct {
	size       providers.GroupSize
	autoscaler string // the attached autoscaler, projects/…/autoscalers/NAME; "" when none
	mode       string // its autoscalingPolicy.mode: ON, OFF, ONLY_SCALE_OUT…
}

// GroupSize reads the MIG: Desired is its targetSize, Instances its managed instances in any
// state (those the group is still trying to create included), Min 0 and Max unknown, unless
// an autoscaler is attached: then Max is the autoscaler's maxNumReplicas and, while the
// autoscaler is on (any mode but OFF), Min its minNumReplicas and Autoscaled names it.
func (p *Provider) GroupSize(ctx context.Context) (providers.GroupSize, error) {
	var g group
	err := p.withAPI(ctx, func(api computeAPI) (err error) {
		g, err = p.readGroup(ctx, api)
		return err
	})
	if err != nil {
		return providers.GroupSize{}, err
	}
	return g.size, nil
}

func (p *Provider) readGroup(ctx context.Context, api computeAPI) (group, error) {
	var igm *computepb.InstanceGroupManager
	err := p.loop.Do(ctx, epGet, func(ctx context.Context) (err error) {
		igm, err = api.getGroup(ctx)
		return annotate(err, "read the group (instanceGroupManagers.get)", permGet)
	})
	if err != nil {
		return group{}, err
	}
	g := group{size: providers.GroupSize{
		Desired:   int(igm.GetTargetSize()),
		Max:       providers.MaxUnknown,
		Instances: instancesOf(igm.GetCurrentActions()),
	}}
	url := igm.GetStatus().GetAutoscaler()
	if url == "" {
		return g, nil
	}
	name := lastSegment(url)
	var as *computepb.Autoscaler
	err = p.loop.Do(ctx, epAutoscaler, func(ctx context.Context) (err error) {
		as, err = api.getAutoscaler(ctx, name)
		return annotate(err, fmt.Sprintf("read the group's autoscaler %q (autoscalers.get)", name), permAutoscaler)
	})
	if err != nil {
		return group{}, err
	}
	pol := as.GetAutoscalingPolicy()
	g.autoscaler, g.mode = resourcePath(url), pol.GetMode()
	if g.mode == "" {
		g.mode = "ON" // the API's default
	}
	if pol.MaxNumReplicas != nil && pol.GetMaxNumReplicas() >= 0 {
		g.size.Max = int(pol.GetMaxNumReplicas())
	}
	// An autoscaler whose mode is OFF scales nothing and does not bound a manual resize from
	// below; its maximum is still the ceiling the group's owner chose, which elasticd keeps.
	if g.mode != "OFF" {
		g.size.Min = int(max(pol.GetMinNumReplicas(), 0))
		g.size.Autoscaled = fmt.Sprintf("a GCP autoscaler (%s, mode %s)", g.autoscaler, g.mode)
	}
	return g, nil
}

// instancesOf counts the managed instances in the MIG's currentActions summary.
func instancesOf(a *computepb.InstanceGroupManagerActionsSummary) int {
	n := int64(a.GetAbandoning()) + int64(a.GetCreating()) + int64(a.GetCreatingWithoutRetries()) +
		int64(a.GetDeleting()) + int64(a.GetNone()) + int64(a.GetRecreating()) + int64(a.GetRefreshing()) +
		int64(a.GetRestarting()) + int64(a.GetResuming()) + int64(a.GetStarting()) + int64(a.GetStopping()) +
		int64(a.GetSuspending()) + int64(a.GetVerifying())
	return int(max(n, 0))
}

// SetDesired resizes the MIG to n (its targetSize) and waits for the resize's operation. A
// MIG whose autoscaler is on is refused: the autoscaler sets the size, and a manual resize
// is ignored or rejected. n above the autoscaler's maxNumReplicas is ErrAboveMax. A MIG
// has no minimum of its own, so SetDesired(0) is a plain resize.
func (p *Provider) SetDesired(ctx context.Context, n int) error {
	what := fmt.Sprintf("resize to %d", n)
	if n < 0 || n > math.MaxInt32 {
		return p.loop.Errorf("%s: not a group size", what)
	}
	var op *compute.Operation
	var api computeAPI
	err := p.withAPI(ctx, func(a computeAPI) error {
		api = a
		g, err := p.readGroup(ctx, a)
		if err != nil {
			return err
		}
		switch {
		case g.autoscaler != "" && g.mode != "OFF":
			return p.loop.Errorf("%w", providers.Refused(what, "the autoscaler's mode set to OFF, or the autoscaler deleted",
				fmt.Errorf("the group has %s, which sets its size and ignores or rejects a manual resize: set the "+
					"autoscaler's mode to OFF (gcloud compute instance-groups managed update-autoscaling %s --mode off) "+
					"or delete it (… stop-autoscaling %s)", g.size.Autoscaled, p.cfg.MIG, p.cfg.MIG)))
		case g.size.Max < providers.MaxUnknown && n > g.size.Max:
			return p.loop.Errorf("%s: %w (%d, the autoscaler's maxNumReplicas, which elasticd never raises)",
				what, providers.ErrAboveMax, g.size.Max)
		case n == g.size.Desired:
			return nil // already so: nothing to ask
		}
		id := requestID() // the same on a retry, so the API does it once
		return p.loop.Do(ctx, epResize, func(ctx context.Context) (err error) {
			op, err = a.resize(ctx, int32(n), id)
			return annotate(err, what, permUpdate)
		})
	})
	if err != nil || op == nil {
		return err
	}
	p.loop.Forget() // the API took the resize: the next poll asks it
	return p.wait(ctx, api, op, what, permUpdate)
}

// Replace recreates one instance of the MIG from its current template (recreateInstances),
// its targetSize unchanged, and waits for the operation. hostID is the instance's numeric ID,
// as Hosts lists it, or its name. An instance the group does not have is ErrNotInGroup.
func (p *Provider) Replace(ctx context.Context, hostID string) error {
	what := fmt.Sprintf("replace instance %s (recreateInstances)", hostID)
	var op *compute.Operation
	var api computeAPI
	err := p.withAPI(ctx, func(a computeAPI) error {
		api = a
		inst, err := p.member(ctx, hostID)
		if err != nil {
			return p.loop.Errorf("%s: %w", what, err)
		}
		id := requestID()
		return p.loop.Do(ctx, epRecreate, func(ctx context.Context) (err error) {
			op, err = a.recreate(ctx, inst, id)
			if notMember(err) {
				return fmt.Errorf("%s: %w: %w", what, providers.ErrNotInGroup, err)
			}
			return annotate(err, what, permUpdate)
		})
	})
	if err != nil || op == nil {
		return err
	}
	p.loop.Forget()
	return p.wait(ctx, api, op, what, permUpdate)
}

// member is the partial URL (zones/Z/instances/NAME) of the group's instance that hostID
// names: its numeric ID, looked up in the managed instances, or its name. A zonal MIG's
// instance named is not looked up: recreateInstances itself says whether it is a member.
func (p *Provider) member(ctx context.Context, hostID string) (string, error) {
	id, idErr := strconv.ParseUint(hostID, 10, 64)
	if idErr != nil && !nameRE.MatchString(hostID) {
		return "", fmt.Errorf("%w: %q is neither an instance ID nor an instance name", providers.ErrNotInGroup, hostID)
	}
	if idErr != nil && p.cfg.Zone != "" {
		return "zones/" + p.cfg.Zone + "/instances/" + hostID, nil
	}
	managed, err := p.listManaged(ctx)
	if err != nil {
		return "", p.explain(err, "list managed instances")
	}
	for _, mi := range managed {
		zone, name, ok := zoneAndName(mi.GetInstance())
		if idErr == nil && mi.GetId() != id || idErr != nil && name != hostID && mi.GetName() != hostID {
			continue
		}
		if !ok {
			return "", fmt.Errorf("the group has no VM for it yet (currentAction %s): nothing to recreate", mi.GetCurrentAction())
		}
		return "zones/" + zone + "/instances/" + name, nil
	}
	return "", fmt.Errorf("%w: the group lists no instance %s", providers.ErrNotInGroup, hostID)
}

// wait polls op until it is DONE, each request through the loop, holding the SDK clients
// only for the request; a DONE operation's errors are the call's error.
func (p *Provider) wait(ctx context.Context, api computeAPI, op *compute.Operation, what, perm string) error {
	delay := opPollFirst
	for !op.Done() {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return p.loop.Errorf("%s: waiting for operation %s: %w", what, op.Name(), ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, opPollMax)
		err := p.withAPI(ctx, func(a computeAPI) error {
			if a != api { // Close ran meanwhile: the operation's client is gone
				return p.loop.Errorf("%s: the provider was closed while waiting for operation %s", what, op.Name())
			}
			return p.loop.Do(ctx, epOperation, func(ctx context.Context) error {
				err := api.pollOperation(ctx, op)
				if err != nil && op.Done() {
					return nil // a failed operation: its errors are read below
				}
				return annotate(err, fmt.Sprintf("%s: wait for operation %s", what, op.Name()), perm)
			})
		})
		if err != nil {
			return err
		}
	}
	if err := operationError(op.Proto()); err != nil {
		if notMember(err) {
			return p.loop.Errorf("%s: %w: %w", what, providers.ErrNotInGroup, err)
		}
		return p.loop.Errorf("%w", annotate(err, what, perm))
	}
	return nil
}

// LaunchFailures lists the MIG's errors of the last hour (listErrors), newest last, but for
// those of taking instances away (DELETING, ABANDONING, STOPPING, SUSPENDING). Each is
// identified by its timestamp, instance and code, and classified by its code: for a stockout
// ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS] or RESOURCE_POOL_EXHAUSTED, for a quota a code
// naming one (QUOTA_EXCEEDED).
func (p *Provider) LaunchFailures(ctx context.Context) ([]providers.LaunchFailure, error) {
	var all []*computepb.InstanceManagedByIgmError
	err := p.withAPI(ctx, func(api computeAPI) error {
		seen := map[string]bool{}
		token := ""
		for page := 1; ; page++ {
			var items []*computepb.InstanceManagedByIgmError
			var next string
			err := p.loop.Do(ctx, epErrors, func(ctx context.Context) (err error) {
				items, next, err = api.listErrors(ctx, token)
				return annotate(err, "list the group's errors (instanceGroupManagers.listErrors)", permGet)
			})
			if err != nil {
				return err
			}
			all = append(all, items...)
			switch {
			case next == "":
				return nil
			case seen[next]:
				return p.loop.Errorf("list the group's errors: the API returned page token %q twice; giving up rather than loop", clip(next))
			case page == maxErrorPages:
				p.log.Warn("the group has more errors than are read; the rest are skipped", "pages", page, "errors", len(all))
				return nil
			}
			seen[next] = true
			token = next
		}
	})
	if err != nil {
		return nil, err
	}
	return p.failures(all, time.Now().Add(-failureWindow)), nil
}

// notLaunching are the MIG's actions that take an instance away: their errors are not
// failures to launch one.
var notLaunching = map[string]bool{"DELETING": true, "ABANDONING": true, "STOPPING": true, "SUSPENDING": true}

// failures turns the MIG's errors since since into launch failures, oldest first.
func (p *Provider) failures(errs []*computepb.InstanceManagedByIgmError, since time.Time) []providers.LaunchFailure {
	out := make([]providers.LaunchFailure, 0, len(errs))
	seen := map[string]bool{}
	for _, e := range errs {
		details := e.GetInstanceActionDetails()
		if notLaunching[details.GetAction()] {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, e.GetTimestamp())
		if err != nil {
			p.log.Debug("skipping a MIG error without a readable timestamp", "timestamp", e.GetTimestamp(), "code", e.GetError().GetCode())
			continue
		}
		if at.Before(since) {
			continue
		}
		inst := resourcePath(details.GetInstance())
		code, msg := e.GetError().GetCode(), e.GetError().GetMessage()
		id := e.GetTimestamp() + " " + inst + " " + code
		if seen[id] {
			continue
		}
		seen[id] = true
		zone, _, ok := zoneAndName(inst)
		if !ok {
			zone = p.cfg.Zone // a regional MIG's error names no zone without an instance
		}
		out = append(out, providers.LaunchFailure{
			ID: id, At: at, Kind: providers.Classify(code, msg), Code: code, Message: msg, Zone: zone,
		})
	}
	slices.SortStableFunc(out, func(a, b providers.LaunchFailure) int { return a.At.Compare(b.At) })
	return out
}

// withAPI runs fn with the SDK clients, making them if need be, while holding apiTurn;
// waiting for the turn honours ctx. fn's errors are returned as they are (prefixed by the
// loop); the clients' own failure is prefixed here.
func (p *Provider) withAPI(ctx context.Context, fn func(api computeAPI) error) error {
	if ctx.Err() == nil {
		select {
		case p.apiTurn <- struct{}{}:
			defer func() { <-p.apiTurn }()
		case <-ctx.Done():
		}
	}
	if err := ctx.Err(); err != nil {
		return p.loop.Errorf("%w", err)
	}
	if err := p.ensureAPI(ctx); err != nil {
		return p.loop.Errorf("%w", err)
	}
	return fn(p.api)
}

// annotate says what failed: err as a refusal of what naming perm when it is a permission
// denied (HTTP 403 that is not a rate limit, in the response or in a failed operation), else
// "what: err". nil stays nil.
func annotate(err error, what, perm string) error {
	if err == nil {
		return nil
	}
	var ge *googleapi.Error
	var oe *opError
	if errors.As(err, &ge) && ge.Code == http.StatusForbidden && !rateLimited(ge) ||
		errors.As(err, &oe) && oe.status == http.StatusForbidden {
		return providers.Refused(what, perm, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// notMember reports whether err says that the instance named is not the group's: HTTP 400
// "… is not a member of …", or 404 for the instance (not for the group), in the response or
// in the operation.
func notMember(err error) bool {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		msg := ge.Message
		for _, e := range ge.Errors {
			msg += " " + e.Message
		}
		return ge.Code == http.StatusBadRequest && strings.Contains(msg, "not a member") ||
			ge.Code == http.StatusNotFound && strings.Contains(msg, "/instances/")
	}
	var oe *opError
	if errors.As(err, &oe) {
		for _, e := range oe.errs {
			if strings.Contains(e.GetMessage(), "not a member") ||
				e.GetCode() == "RESOURCE_NOT_FOUND" && strings.Contains(e.GetMessage(), "/instances/") {
				return true
			}
		}
	}
	return false
}

// opError is a DONE operation's error: Operation.error.errors[], with the HTTP status the
// operation gives for it.
type opError struct {
	name    string
	status  int32
	message string // httpErrorMessage
	errs    []*computepb.Errors
}

func (e *opError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "operation %s failed", e.name)
	if e.status != 0 {
		fmt.Fprintf(&b, " (HTTP %d %s)", e.status, e.message)
	}
	for i, x := range e.errs {
		sep := "; "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%s: %s", sep, x.GetCode(), x.GetMessage())
	}
	return b.String()
}

// operationError is op's error, nil when it has none.
func operationError(op *computepb.Operation) error {
	errs := op.GetError().GetErrors()
	if len(errs) == 0 {
		return nil
	}
	return &opError{name: op.GetName(), status: op.GetHttpErrorStatusCode(), message: op.GetHttpErrorMessage(), errs: errs}
}

// resourcePath is a resource URL from "projects/" on; the URL as it is when it has none.
func resourcePath(url string) string {
	if i := strings.Index(url, "projects/"); i >= 0 {
		return url[i:]
	}
	return url
}

// requestID is a random UUID (version 4) for a mutating request's requestId: the API does a
// request made again with the same ID once.
func requestID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

var _ providers.Capacity = (*Provider)(nil)
