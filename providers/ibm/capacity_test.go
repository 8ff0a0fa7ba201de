package ibm_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/ibm"
	"github.com/elasticd/elasticd/providers/providertest"
)

// TestCapacityConformance runs the shared capacity suite against the real SDK client and the
// fake: a group whose autoscale manager is enabled (min 1, max 8), and one without managers
// (its maximum the API's limit on membership_count).
func TestCapacityConformance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		managers []fakeManager
	}{
		{"AutoscaleManager", []fakeManager{autoscaler(1, 8)}},
		{"NoManager", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			providertest.RunCapacity(t, providertest.CapacityHarness{NewGroup: func(t *testing.T) providertest.CapacityGroup {
				f := newFake(t, instances(5)...)
				f.update(func(f *fakeVPC) { f.managers = slices.Clone(c.managers) })
				return providertest.CapacityGroup{
					Provider: f.provider(t, ibm.Config{}),
					Desired:  func(*testing.T) int { return f.desired() },
					Min:      func(*testing.T) int { return f.minimum() },
					Replaced: func(*testing.T) []string { return f.replaced() },
					RunOut:   func(*testing.T) { f.runOut("cannot_start_capacity") },
					Deny:     func(*testing.T) { f.update(func(f *fakeVPC) { f.denied = true }) },
					Stall:    func(*testing.T) { f.update(func(f *fakeVPC) { f.stalled = true }) },
				}
			}})
		})
	}
}

func bounded(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// calls is the requests made, as "METHOD path body" lines, the query checked on each.
func calls(t *testing.T, f *fakeVPC) []string {
	t.Helper()
	var out []string
	for _, r := range f.requests("") {
		if !strings.Contains(r.query, "generation=2") || !strings.Contains(r.query, "version=") {
			t.Errorf("%s %s?%s: want version and generation=2", r.method, r.path, r.query)
		}
		out = append(out, strings.TrimSpace(r.method+" "+strings.TrimPrefix(r.path, "/v1")+" "+r.body))
	}
	return out
}

func sameCalls(t *testing.T, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("requests:\n got  %q\n want %q", got, want)
	}
}

// TestGroupSize reads each kind of group: the managers decide Min, Max and Autoscaled.
func TestGroupSize(t *testing.T) {
	t.Parallel()
	scheduled := fakeManager{ID: "r006-igm-sched", Name: "nightly", Type: "scheduled", Enabled: true}
	disabled := autoscaler(2, 9)
	disabled.Enabled = false
	for _, c := range []struct {
		name     string
		managers []fakeManager
		want     providers.GroupSize
	}{
		{"none", nil, providers.GroupSize{Desired: 4, Min: 0, Max: 1000, Instances: 4}},
		{"autoscale", []fakeManager{autoscaler(2, 9)},
			providers.GroupSize{Desired: 4, Min: 2, Max: 9, Instances: 4, Autoscaled: `the instance group's autoscale manager "gpu-autoscaler"`}},
		{"autoscale disabled", []fakeManager{disabled}, providers.GroupSize{Desired: 4, Min: 0, Max: 1000, Instances: 4}},
		{"scheduled", []fakeManager{disabled, scheduled},
			providers.GroupSize{Desired: 4, Min: 0, Max: 1000, Instances: 4, Autoscaled: `the instance group's scheduled manager "nightly"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, instances(4)...)
			f.update(func(f *fakeVPC) { f.managers = c.managers })
			got, err := f.provider(t, ibm.Config{}).GroupSize(bounded(t))
			if err != nil {
				t.Fatalf("GroupSize: %v", err)
			}
			if got != c.want {
				t.Errorf("GroupSize:\n got  %+v\n want %+v", got, c.want)
			}
			sameCalls(t, calls(t, f)[1:], []string{ // after the group's lookup by name
				"GET /instance_groups/" + groupID,
				"GET /instance_groups/" + groupID + "/managers",
				"GET /instance_groups/" + groupID + "/memberships",
			})
		})
	}
}

// TestSetDesiredRequests checks the requests of a resize: the enabled manager is disabled
// before membership_count is set, a disabled one is not touched, and nothing is sent for a
// size above the maximum.
func TestSetDesiredRequests(t *testing.T) {
	t.Parallel()
	disabled := autoscaler(1, 8)
	disabled.Enabled = false
	group, managers := "/instance_groups/"+groupID, "/instance_groups/"+groupID+"/managers"
	reads := []string{"GET " + group, "GET " + managers}
	for _, c := range []struct {
		name     string
		managers []fakeManager
		n        int
		want     []string
		err      error
	}{
		{"enabled manager", []fakeManager{autoscaler(1, 8)}, 7, append(reads,
			`PATCH `+managers+`/r006-igm-autoscale {"management_enabled":false}`,
			`PATCH `+group+` {"membership_count":7}`), nil},
		{"to zero", []fakeManager{autoscaler(1, 8)}, 0, append(reads,
			`PATCH `+managers+`/r006-igm-autoscale {"management_enabled":false}`,
			`PATCH `+group+` {"membership_count":0}`), nil},
		{"disabled manager", []fakeManager{disabled}, 12, append(reads, `PATCH `+group+` {"membership_count":12}`), nil},
		{"no manager", nil, 1000, append(reads, `PATCH `+group+` {"membership_count":1000}`), nil},
		{"above the manager's max", []fakeManager{autoscaler(1, 8)}, 9, reads, providers.ErrAboveMax},
		{"above the API's limit", nil, 1001, reads, providers.ErrAboveMax},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, instances(5)...)
			f.update(func(f *fakeVPC) { f.managers = slices.Clone(c.managers) })
			err := f.provider(t, ibm.Config{}).SetDesired(bounded(t), c.n)
			if !errors.Is(err, c.err) {
				t.Fatalf("SetDesired(%d): error %v; want %v", c.n, err, c.err)
			}
			if err != nil {
				wantError(t, err, `ibm: instance group "gpu-spot"`, "maximum")
			}
			sameCalls(t, calls(t, f)[1:], c.want)
			want := c.n
			if c.err != nil {
				want = 5
			}
			if got := f.desired(); got != want {
				t.Errorf("the group holds membership_count %d; want %d", got, want)
			}
		})
	}
}

// TestSetDesiredForgetsHosts: after a resize, the next Hosts polls the API although
// MinInterval has not passed.
func TestSetDesiredForgetsHosts(t *testing.T) {
	t.Parallel()
	f := newFake(t, instances(3)...)
	p := f.provider(t, ibm.Config{MinInterval: time.Hour})
	mustPoll(t, p)
	if err := p.SetDesired(bounded(t), 4); err != nil {
		t.Fatalf("SetDesired: %v", err)
	}
	before := f.count(epMemberships)
	mustPoll(t, p)
	if f.count(epMemberships) == before {
		t.Error("the poll after SetDesired did not reach the API")
	}
}

// TestReplace deletes the member's membership, keeps membership_count, and the next poll
// lists the host as leaving.
func TestReplace(t *testing.T) {
	t.Parallel()
	ins := instances(3)
	f := newFake(t, ins...)
	p := f.provider(t, ibm.Config{MinInterval: time.Hour})
	mustPoll(t, p)
	if err := p.Replace(bounded(t), ins[1].ID); err != nil {
		t.Fatalf("Replace: %v", err)
	}
	sameCalls(t, calls(t, f)[3:], []string{ // after the first poll
		"GET /instance_groups/" + groupID + "/memberships",
		"DELETE /instance_groups/" + groupID + "/memberships/" + ins[1].ID + "-m",
	})
	if got := f.desired(); got != 3 {
		t.Errorf("membership_count after Replace: %d; want 3", got)
	}
	leaving := hostOf(ins[1], slotsByProfile[ins[1].Profile])
	leaving.Leaving = true
	sameHosts(t, mustPoll(t, p), append(hostsOf([]fakeInstance{ins[0], ins[2]}), leaving))

	// The membership is being deleted: replacing the host again is done already.
	if err := p.Replace(bounded(t), ins[1].ID); !errors.Is(err, providers.ErrNotInGroup) {
		t.Errorf("Replace of a host whose membership is being deleted: error %v; want ErrNotInGroup", err)
	}
}

// TestCapacityErrors maps each failure of a change to what it means.
func TestCapacityErrors(t *testing.T) {
	t.Parallel()
	ins := instances(3)
	setDesired := func(ctx context.Context, p *ibm.Provider) error { return p.SetDesired(ctx, 4) }
	replace := func(ctx context.Context, p *ibm.Provider) error { return p.Replace(ctx, ins[0].ID) }
	for _, c := range []struct {
		name     string
		managers []fakeManager
		setup    func(f *fakeVPC)
		op       func(context.Context, *ibm.Provider) error
		is       error // the error wraps it
		isNot    error // and not this
		parts    []string
		requests map[string]int // endpoint → requests made
	}{
		{name: "denied resize", setup: func(f *fakeVPC) { f.denied = true }, op: setDesired, is: providers.ErrRefused,
			parts:    []string{`ibm: instance group "gpu-spot"`, "set membership_count to 4 (from 3) refused", "is.instance-group.instance-group.update", "HTTP 403", "not authorized"},
			requests: map[string]int{epUpdateGroup: 1}},
		{name: "denied manager", managers: []fakeManager{autoscaler(1, 8)}, setup: func(f *fakeVPC) { f.denied = true }, op: setDesired, is: providers.ErrRefused,
			parts:    []string{`disable the autoscale manager "gpu-autoscaler"`, "refused", "Editor role", "HTTP 403"},
			requests: map[string]int{epUpdateManager: 1, epUpdateGroup: 0}},
		{name: "token refused", setup: func(f *fakeVPC) {
			f.queued[epUpdateGroup] = []reply{{status: http.StatusUnauthorized, file: "error_unauthorized.json"}}
		}, op: setDesired, is: providers.ErrRefused, parts: []string{"refused (needs credentials IBM accepts", "HTTP 401"}},
		{name: "manager enabled again", setup: func(f *fakeVPC) {
			f.queued[epUpdateGroup] = []reply{{status: http.StatusBadRequest, file: "error_manager_enabled.json"}}
		}, op: setDesired, is: providers.ErrRefused, parts: []string{"membership_count between 0 and 1000", "HTTP 400", "enabled manager"}},
		{name: "other bad request", setup: func(f *fakeVPC) {
			f.queued[epUpdateGroup] = []reply{{status: http.StatusBadRequest, file: "error_not_found.json"}}
		}, op: setDesired, isNot: providers.ErrRefused, parts: []string{"HTTP 400"}},
		{name: "scaling, then not", setup: func(f *fakeVPC) {
			f.queued[epUpdateGroup] = []reply{{status: http.StatusConflict, file: "error_group_scaling.json"}, {status: http.StatusConflict, file: "error_group_scaling.json"}}
		}, op: setDesired, requests: map[string]int{epUpdateGroup: 3}},
		{name: "scaling throughout", setup: func(f *fakeVPC) { f.status = "scaling" }, op: setDesired, isNot: providers.ErrRefused,
			parts: []string{"HTTP 409", "3 tries", "is scaling", "busy"}, requests: map[string]int{epUpdateGroup: 3}},
		{name: "server error", setup: func(f *fakeVPC) {
			f.queued[epUpdateGroup] = []reply{{status: http.StatusInternalServerError, file: "error_internal.json"}}
		}, op: setDesired, isNot: providers.ErrRefused, parts: []string{"HTTP 500"}, requests: map[string]int{epUpdateGroup: 1}},
		{name: "group gone", setup: func(f *fakeVPC) {
			f.sticky[epGroup] = &reply{status: http.StatusNotFound, file: "error_not_found.json"}
		}, op: setDesired, parts: []string{"no longer exists", "HTTP 404"}, requests: map[string]int{epUpdateGroup: 0}},
		{name: "denied replace", setup: func(f *fakeVPC) { f.denied = true }, op: replace, is: providers.ErrRefused,
			parts: []string{"delete the membership " + ins[0].ID + "-m", "refused", "virtual server instances", "HTTP 403"}},
		{name: "membership gone meanwhile", setup: func(f *fakeVPC) {
			f.queued[epDeleteMembership] = []reply{{status: http.StatusNotFound, file: "error_not_found.json"}}
		}, op: replace, is: providers.ErrNotInGroup},
		{name: "not a member", op: func(ctx context.Context, p *ibm.Provider) error { return p.Replace(ctx, "0717_elsewhere") },
			is: providers.ErrNotInGroup, parts: []string{"0717_elsewhere", "not in the group"}, requests: map[string]int{epDeleteMembership: 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, ins...)
			f.update(func(f *fakeVPC) {
				f.managers = slices.Clone(c.managers)
				if c.setup != nil {
					c.setup(f)
				}
			})
			err := c.op(bounded(t), f.provider(t, ibm.Config{}))
			switch {
			case c.is != nil && !errors.Is(err, c.is):
				t.Errorf("error %v; want one wrapping %v", err, c.is)
			case c.isNot != nil && errors.Is(err, c.isNot):
				t.Errorf("error %v wraps %v", err, c.isNot)
			case c.is == nil && len(c.parts) == 0 && err != nil:
				t.Errorf("error %v; want none", err)
			}
			if len(c.parts) > 0 {
				wantError(t, err, c.parts...)
			}
			for ep, n := range c.requests {
				if got := f.count(ep); got != n {
					t.Errorf("%d requests of %s; want %d", got, ep, n)
				}
			}
		})
	}
}

// TestLaunchFailureCodes lists each status reason IBM gives a failed instance, classified.
func TestLaunchFailureCodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code string
		kind providers.FailureKind
	}{
		{"cannot_start_capacity", providers.NoCapacity},
		{"cannot_start_reservation_capacity", providers.NoCapacity},
		{"cannot_start_compute", providers.OtherFailure},
		{"cannot_start_network", providers.OtherFailure},
		{"cannot_start_ip_address", providers.OtherFailure},
		{"cannot_start_storage", providers.OtherFailure},
		{"cannot_start_placement_group", providers.OtherFailure},
		{"cannot_start_reservation_expired", providers.OtherFailure},
		{"encryption_key_deleted", providers.OtherFailure},
	} {
		t.Run(c.code, func(t *testing.T) {
			f := newFake(t, instances(2)...)
			p := f.provider(t, ibm.Config{})
			fs, err := p.LaunchFailures(bounded(t))
			if err != nil || len(fs) != 0 {
				t.Fatalf("LaunchFailures of a healthy group: %+v, %v; want none", fs, err)
			}
			in := f.runOut(c.code)
			want := []providers.LaunchFailure{{
				ID: in.ID + "-m/" + c.code, At: in.Created, Kind: c.kind, Code: c.code, Message: reasonMessages[c.code], Zone: in.Zone,
			}}
			for range 2 { // the same ID in the next poll
				fs, err := p.LaunchFailures(bounded(t))
				if err != nil {
					t.Fatalf("LaunchFailures: %v", err)
				}
				for i := range fs {
					fs[i].At = fs[i].At.UTC() // as the SDK decoded it, to compare with ==
				}
				if !slices.Equal(fs, want) {
					t.Errorf("LaunchFailures:\n got  %+v\n want %+v", fs, want)
				}
			}
		})
	}
}

// TestLaunchFailuresOrder: newest last; a failed membership without a reason is listed too,
// and a healthy group's listing of memberships is the only request.
func TestLaunchFailuresOrder(t *testing.T) {
	t.Parallel()
	f := newFake(t, instances(2)...)
	p := f.provider(t, ibm.Config{})
	if _, err := p.LaunchFailures(bounded(t)); err != nil {
		t.Fatal(err)
	}
	if n := f.count(epInstances); n != 0 {
		t.Errorf("LaunchFailures of a healthy group listed the instances (%d requests)", n)
	}
	older := f.runOut("cannot_start_capacity")
	f.update(func(f *fakeVPC) {
		in := older
		in.ID, in.Reason, in.Status, in.Created = "0717_no-reason", "", "pending", older.Created.Add(-time.Hour)
		f.instances = append(f.instances, in)
	})
	fs, err := p.LaunchFailures(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, f := range fs {
		ids = append(ids, f.ID+" "+string(f.Kind))
	}
	want := []string{"0717_no-reason-m other", older.ID + "-m/cannot_start_capacity no-capacity"}
	if !slices.Equal(ids, want) {
		t.Errorf("LaunchFailures: %q; want %q (newest last)", ids, want)
	}
}

// TestCapacityBesidePolls runs capacity calls and polls at once (under -race: the provider's
// state is shared by both).
func TestCapacityBesidePolls(t *testing.T) {
	t.Parallel()
	ins := instances(6)
	f := newFake(t, ins...)
	f.update(func(f *fakeVPC) { f.managers = []fakeManager{autoscaler(1, 10)} })
	p := f.provider(t, ibm.Config{})
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 4 {
		wg.Go(func() {
			for range 5 {
				_, err := poll(t, p)
				errs <- err
			}
		})
		wg.Go(func() {
			errs <- p.SetDesired(bounded(t), 6+i%2)
			_, err := p.GroupSize(bounded(t))
			errs <- err
			_, err = p.LaunchFailures(bounded(t))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if err := p.Replace(bounded(t), ins[5].ID); err != nil {
		t.Errorf("Replace: %v", err)
	}
}
