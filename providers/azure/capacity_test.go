package azure_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/azure"
	"github.com/elasticd/elasticd/providers/providertest"
)

func TestCapacityConformance(t *testing.T) {
	providertest.RunCapacity(t, providertest.CapacityHarness{NewGroup: func(t *testing.T) providertest.CapacityGroup {
		f := newFake(t, vm("0", "10.0.0.4"), vm("1", "10.0.0.5"), vm("3", "10.0.0.7"))
		return providertest.CapacityGroup{
			Provider: f.provider(t),
			Desired:  func(*testing.T) int { return f.capacityNow() },
			Replaced: func(*testing.T) []string {
				var names []string
				for _, id := range f.deletedIDs() {
					names = append(names, "gpus_"+id)
				}
				return names
			},
			// A stockout shows on the VMs the set then fails to create: something raises the
			// capacity (a spot restore, the portal) and the new VM fails to allocate.
			RunOut: func(*testing.T) { f.runOutOf("ZonalAllocationFailed"); f.grow(1) },
			Deny:   func(*testing.T) { f.denyWrites() },
			Stall:  func(*testing.T) { f.stallEvery() },
		}
	}})
}

// capCtx bounds one capacity call of a test.
func capCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestGroupSize(t *testing.T) {
	for _, c := range []struct {
		name   string
		single bool
		max    int
	}{{"large set", false, 1000}, {"one placement group", true, 100}} {
		t.Run(c.name, func(t *testing.T) {
			failed := vm("2", "")
			failed.Prov, failed.Power, failed.FailCode = "Failed", "-", "AllocationFailed"
			f := newFake(t, vm("0", "10.0.0.4"), vm("1", "10.0.0.5"), failed)
			f.setScaleSet(setSpec{SKU: "Standard_ND96asr_v4", Priority: "Spot", Mode: "Uniform", SinglePlacement: c.single})
			s, err := f.provider(t).GroupSize(capCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			want := providers.GroupSize{Desired: 3, Min: 0, Max: c.max, Instances: 3}
			if s != want {
				t.Errorf("GroupSize %+v; want %+v (a failed VM is an instance)", s, want)
			}
		})
	}
}

func TestSetDesiredRequests(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"), vm("1", "10.0.0.5"), vm("3", "10.0.0.7"))
	f.setOpPolls(2)
	// A long minimum interval: the hosts after SetDesired come from the cloud only if
	// SetDesired made the loop forget its cached answer.
	p := f.provider(t, func(c *azure.Config) { c.MinInterval = time.Hour })
	if n := len(poll(t, p)); n != 3 {
		t.Fatalf("%d hosts; want 3", n)
	}
	if err := p.SetDesired(capCtx(t), 5); err != nil {
		t.Fatalf("SetDesired(5): %v", err)
	}
	if got, want := f.requestBodies(epUpdate), []string{`{"sku":{"capacity":5}}`}; !slices.Equal(got, want) {
		t.Errorf("PATCH bodies %q; want %q", got, want)
	}
	if v := f.last(epUpdate).Query().Get("api-version"); v != "2025-04-01" {
		t.Errorf("PATCH api-version %q; want the SDK's 2025-04-01", v)
	}
	// Two InProgress answers, then Succeeded; then the SDK's final GET of the set.
	if n := f.count(epOps); n != 3 {
		t.Errorf("%d reads of the operation's status; want 3 (InProgress twice, then Succeeded)", n)
	}
	if n := f.count(epSet); n != 3 {
		t.Errorf("%d GETs of the scale set; want 3 (the first poll, SetDesired's read, the LRO's final GET)", n)
	}
	if c := f.capacityNow(); c != 5 {
		t.Errorf("the fake holds capacity %d; want 5", c)
	}
	if n := len(poll(t, p)); n != 5 {
		t.Errorf("after SetDesired(5), Hosts lists %d hosts; want 5 (the cached answer must be forgotten)", n)
	}

	// The capacity it already holds is not written again.
	if err := p.SetDesired(capCtx(t), 5); err != nil {
		t.Fatalf("SetDesired(5) again: %v", err)
	}
	if n := len(f.requestBodies(epUpdate)); n != 1 {
		t.Errorf("%d PATCHes; want 1: the capacity was already 5", n)
	}
}

func TestSetDesiredAboveMaxCallsNothing(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	f.setScaleSet(setSpec{SKU: "Standard_ND96asr_v4", Priority: "Spot", Mode: "Uniform", SinglePlacement: true})
	err := f.provider(t).SetDesired(capCtx(t), 101)
	if !errors.Is(err, providers.ErrAboveMax) || !strings.Contains(err.Error(), "at most 100") {
		t.Errorf("SetDesired(101) on a one-placement-group set: %v; want ErrAboveMax saying at most 100", err)
	}
	if n := f.count(epUpdate); n != 0 {
		t.Errorf("%d PATCHes; want none", n)
	}
}

// TestSetDesiredLaunchFailures: the operation of a scale-out that cannot be allocated fails;
// the set keeps the new capacity with failed VMs, SetDesired succeeds, and LaunchFailures
// lists the operation's failure and the failed VMs, under the same IDs poll after poll.
func TestSetDesiredLaunchFailures(t *testing.T) {
	for _, c := range []struct {
		code string
		kind providers.FailureKind
	}{
		{"ZonalAllocationFailed", providers.NoCapacity},
		{"AllocationFailed", providers.NoCapacity},
		{"OverconstrainedAllocationRequest", providers.NoCapacity},
		{"OverconstrainedZonalAllocationRequest", providers.NoCapacity},
		{"SkuNotAvailable", providers.NoCapacity},
		{"OperationNotAllowed", providers.Quota},
	} {
		t.Run(c.code, func(t *testing.T) {
			f := newFake(t, vm("0", "10.0.0.4"))
			p := f.provider(t)
			f.runOutOf(c.code)
			if err := p.SetDesired(capCtx(t), 3); err != nil {
				t.Fatalf("SetDesired(3) that the cloud could not fill: %v; want nil", err)
			}
			if n := f.capacityNow(); n != 3 {
				t.Errorf("capacity %d; want 3: the cloud keeps what was set", n)
			}
			fs, err := p.LaunchFailures(capCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			var ops, vms int
			for i, fl := range fs {
				if fl.Code != c.code || fl.Kind != c.kind || fl.Message == "" || fl.ID == "" || fl.At.IsZero() {
					t.Errorf("failure %+v; want code %s, kind %s, a message, an ID and a time", fl, c.code, c.kind)
				}
				if i > 0 && fl.At.Before(fs[i-1].At) {
					t.Errorf("failures out of order (want newest last): %+v", fs)
				}
				switch {
				case strings.HasPrefix(fl.ID, "operation/"):
					ops++
				case strings.HasPrefix(fl.ID, "vm/gpus_"):
					vms++
					if !strings.HasPrefix(fl.Zone, "eastus-") {
						t.Errorf("failed VM's zone %q; want eastus-<zone>", fl.Zone)
					}
				}
			}
			if ops != 1 || vms != 2 {
				t.Errorf("failures %+v; want the operation's and the 2 failed VMs'", fs)
			}
			again, err := p.LaunchFailures(capCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			ids := func(fs []providers.LaunchFailure) []string {
				var s []string
				for _, f := range fs {
					s = append(s, f.ID)
				}
				return s
			}
			if !slices.Equal(ids(fs), ids(again)) {
				t.Errorf("IDs changed between polls: %q, then %q", ids(fs), ids(again))
			}
		})
	}
}

func TestSetDesiredErrors(t *testing.T) {
	for _, c := range []struct {
		name    string
		reply   reply
		refused bool
		is      error
		says    []string
		failure providers.FailureKind // listed by LaunchFailures after it, if any
	}{
		{name: "denied", reply: reply{status: http.StatusForbidden, file: "error_authorization_failed_action.json",
			data: map[string]any{"Action": "Microsoft.Compute/virtualMachineScaleSets/write"}},
			refused: true, says: []string{"Microsoft.Compute/virtualMachineScaleSets/write", "AuthorizationFailed", "Virtual Machine Contributor"}},
		{name: "quota", reply: reply{status: http.StatusConflict, file: "error_quota_exceeded.json"},
			says: []string{"OperationNotAllowed", "quota"}, failure: providers.Quota},
		{name: "size not available", reply: reply{status: http.StatusConflict,
			raw: []byte(`{"error":{"code":"SkuNotAvailable","message":"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: Standard_ND96asr_v4' is currently not available in location 'eastus' zones '2'."}}`)},
			says: []string{"SkuNotAvailable"}, failure: providers.NoCapacity},
		{name: "invalid", reply: reply{status: http.StatusBadRequest, file: "error_capacity_too_large.json", data: map[string]any{"Capacity": 4, "Max": 3}},
			refused: true, says: []string{"InvalidParameter", "sku.capacity"}},
		{name: "credentials rejected", reply: reply{status: http.StatusUnauthorized, file: "error_invalid_token.json"},
			says: []string{"credentials were rejected"}},
		{name: "throttled", reply: throttled("Retry-After", "30"), is: azure.ErrThrottled, says: []string{"throttled"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, vm("0", "10.0.0.4"))
			p := f.provider(t, func(c *azure.Config) { c.MaxRetryWait = 100 * time.Millisecond })
			f.queue(epUpdate, c.reply)
			err := p.SetDesired(capCtx(t), 4)
			if err == nil {
				t.Fatal("SetDesired: no error")
			}
			t.Logf("error: %v", err)
			if got := errors.Is(err, providers.ErrRefused); got != c.refused {
				t.Errorf("refused %v; want %v", got, c.refused)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error does not wrap %v", c.is)
			}
			for _, s := range append(c.says, `scale set "gpus"`) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not say %q", s)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans several lines")
			}
			fs, ferr := p.LaunchFailures(capCtx(t))
			if ferr != nil {
				t.Fatal(ferr)
			}
			if c.failure == "" && len(fs) > 0 {
				t.Errorf("LaunchFailures %+v; want none", fs)
			}
			if c.failure != "" && (len(fs) != 1 || fs[0].Kind != c.failure) {
				t.Errorf("LaunchFailures %+v; want one %s failure", fs, c.failure)
			}
		})
	}
}

// TestThrottledWriteRests: a throttled PATCH closes its endpoint's gate for the server's
// Retry-After; a call whose context cannot outlive the rest fails at once without a request.
func TestThrottledWriteRests(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	p := f.provider(t, func(c *azure.Config) { c.MaxRetryWait = 100 * time.Millisecond })
	f.queue(epUpdate, throttled("Retry-After", "30"))
	if err := p.SetDesired(capCtx(t), 2); !errors.Is(err, azure.ErrThrottled) {
		t.Fatalf("SetDesired: %v; want ErrThrottled", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	start := time.Now()
	err := p.SetDesired(ctx, 2)
	if !errors.Is(err, azure.ErrThrottled) || time.Since(start) > 500*time.Millisecond {
		t.Errorf("SetDesired while the endpoint rests: %v after %v; want ErrThrottled at once", err, time.Since(start))
	}
	t.Logf("while it rests: %v", err)
	if n := f.count(epUpdate); n != 1 {
		t.Errorf("%d PATCHes; want 1: none while the endpoint rests", n)
	}
}

func TestSetDesiredOperationFails(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	p := f.provider(t)
	f.runOutOf("InternalExecutionError") // not a capacity failure: SetDesired's own
	err := p.SetDesired(capCtx(t), 2)
	if err == nil || errors.Is(err, providers.ErrRefused) || !strings.Contains(err.Error(), "InternalExecutionError") {
		t.Errorf("SetDesired whose operation failed: %v; want an error naming InternalExecutionError, not a refusal", err)
	}
	if fs, _ := p.LaunchFailures(capCtx(t)); slices.ContainsFunc(fs, func(f providers.LaunchFailure) bool { return strings.HasPrefix(f.ID, "operation/") }) {
		t.Errorf("an operation failure that is not about capacity is listed: %+v", fs)
	}
}

func TestSetDesiredHonoursContextDuringOperation(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	p := f.provider(t)
	f.setOpPolls(1 << 30) // a scale-out that never ends
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.SetDesired(ctx, 2)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("SetDesired: %v; want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("took %v after a 200ms deadline", took)
	}
	if f.count(epOps) == 0 {
		t.Error("the operation was never polled")
	}
}

func TestReplace(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"), vm("1", "10.0.0.5"), vm("3", "10.0.0.7"))
	p := f.provider(t, func(c *azure.Config) { c.MinInterval = time.Hour })
	poll(t, p)
	if err := p.Replace(capCtx(t), "gpus_1"); err != nil {
		t.Fatalf("Replace: %v", err)
	}
	if got, want := f.requestBodies(epDelete), []string{`{"instanceIds":["1"]}`}; !slices.Equal(got, want) {
		t.Errorf("POST …/delete bodies %q; want %q", got, want)
	}
	if got, want := f.requestBodies(epUpdate), []string{`{"sku":{"capacity":3}}`}; !slices.Equal(got, want) {
		t.Errorf("PATCH bodies %q; want %q (the capacity before the delete)", got, want)
	}
	if c := f.capacityNow(); c != 3 {
		t.Errorf("capacity %d after Replace; want 3", c)
	}
	if got, want := f.instanceIDs(), []string{"0", "3", "4"}; !slices.Equal(got, want) {
		t.Errorf("instances %v; want %v: VM 1 gone, a fresh VM 4", got, want)
	}
	var ids []string
	for _, h := range poll(t, p) {
		ids = append(ids, h.ID)
	}
	slices.Sort(ids)
	if want := []string{"gpus_0", "gpus_3", "gpus_4"}; !slices.Equal(ids, want) {
		t.Errorf("hosts after Replace %v; want %v (the cached answer must be forgotten)", ids, want)
	}
}

func TestReplaceNotInGroup(t *testing.T) {
	for _, c := range []struct {
		name, host string
		reply      *reply // queued for the POST, if any
		requests   int    // POSTs made
	}{
		{"deleted already", "gpus_7", nil, 1},
		{"not found", "gpus_3", &reply{status: http.StatusNotFound, file: "error_resource_not_found.json"}, 1},
		{"another set's VM", "other_1", nil, 0},
		{"not a VM name", "gpus_x", nil, 0},
		{"a bare instance ID", "3", nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, vm("0", "10.0.0.4"), vm("3", "10.0.0.7"))
			if c.reply != nil {
				f.queue(epDelete, *c.reply)
			}
			err := f.provider(t).Replace(capCtx(t), c.host)
			if !errors.Is(err, providers.ErrNotInGroup) {
				t.Errorf("Replace(%q): %v; want ErrNotInGroup", c.host, err)
			}
			if n := f.count(epDelete); n != c.requests {
				t.Errorf("%d POSTs; want %d", n, c.requests)
			}
			if n := f.count(epUpdate); n != 0 || f.capacityNow() != 2 {
				t.Errorf("%d PATCHes, capacity %d; want none and 2", n, f.capacityNow())
			}
		})
	}
}

func TestReplaceRefused(t *testing.T) {
	t.Run("delete denied", func(t *testing.T) {
		f := newFake(t, vm("0", "10.0.0.4"))
		f.denyWrites()
		err := f.provider(t).Replace(capCtx(t), "gpus_0")
		if !errors.Is(err, providers.ErrRefused) || !strings.Contains(err.Error(), "Microsoft.Compute/virtualMachineScaleSets/delete/action") {
			t.Errorf("Replace: %v; want ErrRefused naming …/delete/action", err)
		}
	})
	t.Run("restore denied", func(t *testing.T) {
		f := newFake(t, vm("0", "10.0.0.4"), vm("1", "10.0.0.5"))
		f.queue(epUpdate, reply{status: http.StatusForbidden, file: "error_authorization_failed_action.json",
			data: map[string]any{"Action": "Microsoft.Compute/virtualMachineScaleSets/write"}})
		err := f.provider(t).Replace(capCtx(t), "gpus_0")
		if !errors.Is(err, providers.ErrRefused) || !strings.Contains(err.Error(), "Microsoft.Compute/virtualMachineScaleSets/write") ||
			!strings.Contains(err.Error(), "capacity stays 1") {
			t.Errorf("Replace: %v; want ErrRefused naming …/write and saying the capacity stays 1", err)
		}
		if c := f.capacityNow(); c != 1 {
			t.Errorf("capacity %d; want 1", c)
		}
	})
}

// TestReplaceKeepsCapacityInStockout: the fresh VM fails to allocate; Replace has done its
// part (the capacity is back), and the failure is listed.
func TestReplaceKeepsCapacityInStockout(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"), vm("1", "10.0.0.5"))
	p := f.provider(t)
	f.runOutOf("AllocationFailed")
	if err := p.Replace(capCtx(t), "gpus_1"); err != nil {
		t.Fatalf("Replace: %v", err)
	}
	if c := f.capacityNow(); c != 2 {
		t.Errorf("capacity %d; want 2", c)
	}
	fs, err := p.LaunchFailures(capCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 2 || fs[0].Code != "AllocationFailed" || fs[1].Code != "AllocationFailed" {
		t.Errorf("LaunchFailures %+v; want the operation's and the new VM's AllocationFailed", fs)
	}
}
