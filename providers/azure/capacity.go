package azure

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/throttle"
)

// Steering the scale set: its size is sku.capacity, which a PATCH sets; one VM is handed
// back by deleting it and putting the capacity back. Both are ARM long-running operations
// (LROs): the request is accepted at once and the scale-out or deletion runs after it, and
// an allocation failure (no spot capacity) is the operation's failure, not the request's.

// Endpoints of the capacity calls, keys of the loop's gates beside opScaleSet and opVMs.
const (
	opUpdate = "update scale set capacity" // PATCH …/virtualMachineScaleSets/{vmss}
	opDelete = "delete scale set instance" // POST …/virtualMachineScaleSets/{vmss}/delete
)

// The RBAC actions the capacity calls need beside the read ones (docs/providers/azure.md).
const (
	actionWrite  = "Microsoft.Compute/virtualMachineScaleSets/write"
	actionDelete = "Microsoft.Compute/virtualMachineScaleSets/delete/action"
)

// DefaultLROPollInterval is how often a long-running operation's status is read when ARM
// names no Retry-After. A GPU scale-out takes minutes; the SDK's own default (30 s) would
// add up to half a minute to every SetDesired and Replace.
const DefaultLROPollInterval = 5 * time.Second

// A Uniform scale set holds at most 1,000 VMs, and at most 100 while it is one placement
// group (singlePlacementGroup true); ARM refuses a capacity above that. These are the only
// maximums Azure enforces on a set (a set built from a managed image stops at 600, which ARM
// refuses in its own words; quota is the subscription's, not the set's).
const (
	maxVMs             = 1000
	maxVMsOnePlacement = 100
)

// keptFailures bounds the LRO failures remembered for LaunchFailures: the driver counts each
// ID once, so only the recent ones matter.
const keptFailures = 32

var _ providers.Capacity = (*Provider)(nil)

// GroupSize reads sku.capacity from the scale set and counts its VMs (one listing, in any
// state). Azure has no minimum; the maximum is the placement limit above.
func (p *Provider) GroupSize(ctx context.Context) (providers.GroupSize, error) {
	if err := ctx.Err(); err != nil {
		return providers.GroupSize{}, p.loop.Errorf("group size: %w", err)
	}
	desired, max, err := p.capacity(ctx)
	if err != nil {
		return providers.GroupSize{}, err
	}
	n := 0
	err = walk(ctx, p, opVMs, p.api.vms(), func(page []*armcompute.VirtualMachineScaleSetVM) error {
		for _, vm := range page {
			if vm != nil {
				n++
			}
		}
		return nil
	})
	if err != nil {
		return providers.GroupSize{}, p.loop.Errorf("%w", p.explain(ctx, opVMs, err))
	}
	return providers.GroupSize{Desired: desired, Min: 0, Max: max, Instances: n}, nil
}

// capacity reads the scale set's sku.capacity and the most it may hold.
func (p *Provider) capacity(ctx context.Context) (desired, max int, err error) {
	ss, err := callOnce(ctx, p, opScaleSet, p.api.scaleSet)
	if err != nil {
		return 0, 0, p.loop.Errorf("%w", p.explain(ctx, opScaleSet, err))
	}
	if err := uniform(ss); err != nil {
		return 0, 0, p.loop.Errorf("%w", err)
	}
	if ss.SKU == nil || ss.SKU.Capacity == nil || *ss.SKU.Capacity < 0 {
		return 0, 0, p.loop.Errorf("%s: the answer has no sku.capacity: the response is malformed", opScaleSet)
	}
	max = maxVMs
	if ss.Properties != nil && deref(ss.Properties.SinglePlacementGroup) {
		max = maxVMsOnePlacement
	}
	return int(*ss.SKU.Capacity), max, nil
}

// SetDesired sets sku.capacity to n and waits for the scale-out or scale-in. When the cloud
// accepts the capacity but cannot allocate the VMs (AllocationFailed, ZonalAllocationFailed,
// SkuNotAvailable, …) or the quota runs out (OperationNotAllowed) while the operation runs,
// the set keeps the new capacity with failed VMs in it: that is not SetDesired's error but a
// launch failure, which LaunchFailures lists. A capacity already n is not written again.
func (p *Provider) SetDesired(ctx context.Context, n int) error {
	if err := ctx.Err(); err != nil {
		return p.loop.Errorf("set desired size: %w", err)
	}
	if n < 0 {
		return p.loop.Errorf("set desired size %d: must not be negative", n)
	}
	if !p.takeWrite(ctx) {
		return p.loop.Errorf("set desired size: waiting for the capacity call in progress: %w", ctx.Err())
	}
	defer p.releaseWrite()
	cur, max, err := p.capacity(ctx)
	if err != nil {
		return err
	}
	if n > max {
		return p.loop.Errorf("set desired size %d: %w: the scale set holds at most %d VMs", n, providers.ErrAboveMax, max)
	}
	if n == cur {
		return nil
	}
	return p.setCapacity(ctx, n)
}

// setCapacity is one PATCH of sku.capacity and the wait for its operation.
func (p *Provider) setCapacity(ctx context.Context, n int) error {
	err := p.loop.Do(ctx, opUpdate, func(ctx context.Context) error {
		err := p.api.setCapacity(p.retryContext(ctx), int64(n), p.lroEvery)
		return p.writeError(ctx, opUpdate, actionWrite, err)
	})
	if err != nil {
		return gated(err)
	}
	p.loop.Forget()
	return nil
}

// Replace deletes the VM named hostID (POST …/delete, which lowers sku.capacity by one) and
// then puts the capacity back to what it was, so that the set creates a fresh VM from its
// model: a new host, a new name, on whatever node ARM allocates.
//
// Redeploy (POST …/virtualMachines/{id}/redeploy) would move the same VM to another node,
// keeping its name, disk and whatever state broke it; the driver would see the same host
// come back, and a host it gave up on must not return under the same ID. Delete and
// re-grow is what the other clouds' Replace does (a terminate without decrement, a MIG
// recreate).
func (p *Provider) Replace(ctx context.Context, hostID string) error {
	if err := ctx.Err(); err != nil {
		return p.loop.Errorf("replace %q: %w", hostID, err)
	}
	if !p.takeWrite(ctx) {
		return p.loop.Errorf("replace %q: waiting for the capacity call in progress: %w", hostID, ctx.Err())
	}
	defer p.releaseWrite()
	// The set is read first, even for a name that cannot be its VM's: a missing set or
	// permission is said before "not in the group" is.
	before, _, err := p.capacity(ctx)
	if err != nil {
		return err
	}
	id, ok := p.instanceID(hostID)
	if !ok {
		return p.loop.Errorf("replace %q: %w: the scale set's VMs are named %s_<instance ID>", hostID, providers.ErrNotInGroup, p.cfg.VMSS)
	}
	err = p.loop.Do(ctx, opDelete, func(ctx context.Context) error {
		err := p.api.deleteInstance(p.retryContext(ctx), id, p.lroEvery)
		if notInSet(err, id) {
			return fmt.Errorf("%s %s (%s): %w: %w", opDelete, id, hostID, providers.ErrNotInGroup, p.explain(ctx, opDelete, err))
		}
		return p.writeError(ctx, opDelete, actionDelete, err)
	})
	if err != nil {
		return gated(err)
	}
	p.loop.Forget()
	// Between the two calls the set is one VM short; a failure here leaves it so, and says so.
	if err := p.setCapacity(ctx, before); err != nil {
		return fmt.Errorf("%w (VM %s was deleted; the capacity stays %d until it is set to %d again)", err, hostID, before-1, before)
	}
	return nil
}

// gated makes the error of a call that an endpoint's rest kept from being made (a
// *throttle.Error from the loop's gate) wrap ErrThrottled, as a throttled request's does.
func gated(err error) error {
	var te *throttle.Error
	if errors.As(err, &te) && !errors.Is(err, ErrThrottled) {
		return &apiError{msg: err.Error(), err: err, throttled: true}
	}
	return err
}

// instanceID is the instance ID in a VM name as Hosts lists it, <vmss>_<instance ID>.
func (p *Provider) instanceID(hostID string) (string, bool) {
	prefix := p.cfg.VMSS + "_"
	if len(hostID) <= len(prefix) || !strings.EqualFold(hostID[:len(prefix)], prefix) {
		return "", false
	}
	id := hostID[len(prefix):]
	if _, err := strconv.ParseUint(id, 10, 32); err != nil {
		return "", false // Uniform instance IDs are decimal
	}
	return id, true
}

// notInSet says that ARM refused a delete because the instance is not the set's: a 404, or
// the 400 InvalidParameter "The provided instanceId 3 is not an active Virtual Machine Scale
// Set VM instanceId." that it gives for an instance already deleted.
func notInSet(err error, id string) bool {
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return false
	}
	if re.StatusCode == http.StatusNotFound {
		return true
	}
	code, msg := armError(re)
	return re.StatusCode == http.StatusBadRequest && strings.EqualFold(code, "InvalidParameter") &&
		strings.Contains(msg, " "+id+" ")
}

// writeError maps the error of a capacity call that needs RBAC action, or nil when there is
// none to return: a launch failure is remembered (see SetDesired).
func (p *Provider) writeError(ctx context.Context, op, action string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return p.explain(ctx, op, err)
	}
	var le *lroError
	if errors.As(err, &le) {
		f := operationFailure(op, le.re, time.Now())
		if f.Kind == providers.NoCapacity || f.Kind == providers.Quota {
			p.remember(f)
			return nil
		}
		return &apiError{err: err, msg: fmt.Sprintf("%s: the operation failed: %s: %s", op, f.Code, f.Message)}
	}
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return p.explain(ctx, op, err)
	}
	code, msg := armError(re)
	what := fmt.Sprintf("HTTP %d %s: %s", re.StatusCode, code, msg)
	switch {
	case re.StatusCode == http.StatusForbidden:
		return providers.Refused(op, action+" on the scale set; the Virtual Machine Contributor role has it",
			&apiError{err: err, msg: what})
	case re.StatusCode == http.StatusUnauthorized, re.StatusCode == http.StatusTooManyRequests:
		return p.explain(ctx, op, err)
	}
	// A capacity or quota refusal of the request itself: nothing was set, and the failure
	// is one the driver must see among the launch failures.
	if k := providers.Classify(code, msg); k == providers.NoCapacity || k == providers.Quota {
		f := providers.LaunchFailure{ID: requestID(op, re, time.Now()), At: time.Now(), Kind: k, Code: code, Message: msg}
		p.remember(f)
		return &apiError{err: err, msg: fmt.Sprintf("%s: %s", op, what)}
	}
	if re.StatusCode == http.StatusBadRequest {
		return providers.Refused(op, "", &apiError{err: err, msg: what})
	}
	return p.explain(ctx, op, err)
}

// remember keeps f for LaunchFailures.
func (p *Provider) remember(f providers.LaunchFailure) {
	p.log.Warn("the scale set could not launch its VMs", "code", f.Code, "kind", f.Kind, "id", f.ID, "message", f.Message)
	p.mu.Lock()
	defer p.mu.Unlock()
	if slices.ContainsFunc(p.failures, func(g providers.LaunchFailure) bool { return g.ID == f.ID }) {
		return
	}
	p.failures = append(p.failures, f)
	if len(p.failures) > keptFailures {
		p.failures = slices.Delete(p.failures, 0, len(p.failures)-keptFailures)
	}
}

// operationFailure reads a failed LRO's status resource, {"name","startTime","endTime",
// "status":"Failed","error":{"code","message","details":[…]}}. Where the top-level code says
// nothing of capacity, a detail that does gives the code.
func operationFailure(op string, re *azcore.ResponseError, now time.Time) providers.LaunchFailure {
	type detail struct {
		Code, Message string
		Details       []detail
	}
	var b struct {
		Name    string
		EndTime string
		Error   detail
	}
	if body, err := runtime.Payload(re.RawResponse); err == nil {
		_ = json.Unmarshal(body, &b) // a body that is not the resource leaves the fallbacks below
	}
	d := b.Error
	d.Code = cmp.Or(d.Code, re.ErrorCode)
	if providers.Classify(d.Code, d.Message) == providers.OtherFailure {
		for _, x := range d.Details {
			if providers.Classify(x.Code, x.Message) != providers.OtherFailure {
				d = x
				break
			}
		}
	}
	at := now
	if t, err := time.Parse(time.RFC3339Nano, b.EndTime); err == nil {
		at = t
	}
	name := b.Name
	if name == "" && re.RawResponse != nil && re.RawResponse.Request != nil {
		name = path.Base(re.RawResponse.Request.URL.Path) // …/operations/{name}
	}
	id := "operation/" + name
	if name == "" || name == "/" || name == "." {
		id = requestID(op, re, at)
	}
	return providers.LaunchFailure{
		ID: id, At: at, Kind: providers.Classify(d.Code, d.Message),
		Code: d.Code, Message: clip(oneLine(d.Message), 300),
	}
}

// requestID names a failure that has no operation: the call, the time and ARM's request ID.
func requestID(op string, re *azcore.ResponseError, at time.Time) string {
	id := op + "/" + at.UTC().Format(time.RFC3339Nano)
	if re.RawResponse != nil {
		if r := re.RawResponse.Header.Get("x-ms-request-id"); r != "" {
			id += "/" + r
		}
	}
	return id
}

// LaunchFailures lists the failures remembered from SetDesired and Replace, and the VMs that
// failed to provision, with instance view status ProvisioningState/failed/<code>, from one
// listing of the set's VMs (the listing Hosts makes, instance views included: no call per
// VM). A VM's failure keeps its ID while the VM stays failed; the list is oldest first.
func (p *Provider) LaunchFailures(ctx context.Context) ([]providers.LaunchFailure, error) {
	if err := ctx.Err(); err != nil {
		return nil, p.loop.Errorf("launch failures: %w", err)
	}
	var out []providers.LaunchFailure
	err := walk(ctx, p, opVMs, p.api.vms(), func(page []*armcompute.VirtualMachineScaleSetVM) error {
		for _, vm := range page {
			if f, ok := p.vmFailure(vm); ok {
				out = append(out, f)
			}
		}
		return nil
	})
	if err != nil {
		return nil, p.loop.Errorf("%w", p.explain(ctx, opVMs, err))
	}
	p.mu.Lock()
	out = append(out, p.failures...)
	p.mu.Unlock()
	slices.SortStableFunc(out, func(a, b providers.LaunchFailure) int { return a.At.Compare(b.At) })
	return out, nil
}

// vmFailure is the launch failure of a VM whose provisioning failed, if it is one.
func (p *Provider) vmFailure(vm *armcompute.VirtualMachineScaleSetVM) (providers.LaunchFailure, bool) {
	if vm == nil || vm.Properties == nil || vm.Properties.InstanceView == nil ||
		!strings.EqualFold(deref(vm.Properties.ProvisioningState), "Failed") {
		return providers.LaunchFailure{}, false
	}
	for _, s := range vm.Properties.InstanceView.Statuses {
		if s == nil {
			continue
		}
		c := deref(s.Code)
		const prefix = "provisioningstate/failed/"
		if len(c) <= len(prefix) || !strings.EqualFold(c[:len(prefix)], prefix) {
			continue
		}
		code, msg := c[len(prefix):], clip(oneLine(deref(s.Message)), 300)
		name := cmp.Or(deref(vm.Name), p.cfg.VMSS+"_"+deref(vm.InstanceID))
		at := cmp.Or(deref(s.Time), deref(vm.Properties.TimeCreated))
		id := "vm/" + name + "/" + code
		if !at.IsZero() {
			id += "/" + at.UTC().Format(time.RFC3339Nano) // the same VM failing again is a new failure
		}
		zone := strings.ToLower(deref(vm.Location))
		if len(vm.Zones) > 0 && deref(vm.Zones[0]) != "" && zone != "" {
			zone += "-" + *vm.Zones[0]
		}
		return providers.LaunchFailure{ID: id, At: at, Kind: providers.Classify(code, msg), Code: code, Message: msg, Zone: zone}, true
	}
	return providers.LaunchFailure{}, false
}

// takeWrite waits, under ctx, for the turn of the capacity calls: Replace reads the capacity
// and writes it back, which a SetDesired between the two would undo.
func (p *Provider) takeWrite(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	default:
	}
	select {
	case p.writeTurn <- struct{}{}:
		if ctx.Err() != nil {
			<-p.writeTurn
			return false
		}
		return true
	case <-ctx.Done():
		return false
	}
}

func (p *Provider) releaseWrite() { <-p.writeTurn }
