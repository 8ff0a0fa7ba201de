package gcp_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/gcp"
	"github.com/elasticd/elasticd/providers/providertest"
	"google.golang.org/protobuf/proto"
)

// The zonal group runs without an autoscaler (no maximum); the regional one has an
// autoscaler whose mode is OFF, so that its maxNumReplicas bounds SetDesired.
func TestCapacityConformance(t *testing.T) {
	for _, dir := range []string{"zonal", "regional"} {
		t.Run(dir, func(t *testing.T) {
			providertest.RunCapacity(t, providertest.CapacityHarness{NewGroup: func(t *testing.T) providertest.CapacityGroup {
				f := newFake(t, dir)
				if dir == "regional" {
					f.autoscaler = autoscaler("OFF", 0, f.targetSize+3)
				}
				return providertest.CapacityGroup{
					Provider: f.provider(t, nil),
					Desired:  func(t *testing.T) int { f.mu.Lock(); defer f.mu.Unlock(); return int(f.targetSize) },
					Replaced: func(t *testing.T) []string { f.mu.Lock(); defer f.mu.Unlock(); return slices.Clone(f.recreated) },
					RunOut:   func(t *testing.T) { f.runOut() },
					Deny:     func(t *testing.T) { f.change(func(f *fakeCompute) { f.denied = true }) },
					Stall:    func(t *testing.T) { f.change(func(f *fakeCompute) { f.stalled = true }) },
				}
			}})
		})
	}
}

func autoscaler(mode string, min, max int32) *computepb.Autoscaler {
	pol := &computepb.AutoscalingPolicy{MinNumReplicas: proto.Int32(min), MaxNumReplicas: proto.Int32(max),
		CoolDownPeriodSec: proto.Int32(60), CpuUtilization: &computepb.AutoscalingPolicyCpuUtilization{UtilizationTarget: proto.Float64(0.6)}}
	if mode != "" {
		pol.Mode = proto.String(mode)
	}
	return &computepb.Autoscaler{Name: proto.String("gpu-mig-as"), AutoscalingPolicy: pol}
}

func capCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// requestsTo are the fake's requests to endpoint.
func requestsTo(f *fakeCompute, endpoint string) []request {
	return slices.DeleteFunc(f.log(), func(r request) bool { return r.endpoint != endpoint })
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestCapacityRequests(t *testing.T) {
	t.Run("GroupSize reads targetSize and currentActions", func(t *testing.T) {
		f := newFake(t, "zonal")
		s, err := f.provider(t, nil).GroupSize(capCtx(t))
		// testdata/zonal: 11 managed instances, 2 of them DELETING, so a targetSize of 9.
		want := providers.GroupSize{Desired: 9, Min: 0, Max: providers.MaxUnknown, Instances: 11}
		if err != nil || s != want {
			t.Fatalf("GroupSize = %+v, %v; want %+v", s, err, want)
		}
		if rs := f.log(); len(rs) != 1 || rs[0].method != "GET" || rs[0].path != "/compute/v1/projects/test-project/zones/us-central1-a/instanceGroupManagers/gpu-mig" {
			t.Errorf("requests %+v; want one GET of the MIG", rs)
		}
	})
	for _, c := range []struct {
		dir, scope string
		id, inst   string // Replace(id) recreates inst
	}{
		{"zonal", "zones/us-central1-a", "1002", "zones/us-central1-a/instances/gpu-mig-a002"},
		{"regional", "regions/us-central1", "3003", "zones/us-central1-b/instances/gpu-rmig-b0"},
	} {
		t.Run(c.dir, func(t *testing.T) {
			f := newFake(t, c.dir)
			p := f.provider(t, nil)
			igm := "/compute/v1/projects/test-project/" + c.scope + "/instanceGroupManagers/gpu-mig"

			if err := p.SetDesired(capCtx(t), 14); err != nil {
				t.Fatalf("SetDesired(14): %v", err)
			}
			rs := requestsTo(f, epResize)
			if len(rs) != 1 || rs[0].method != "POST" || rs[0].path != igm+"/resize" || rs[0].query.Get("size") != "14" || len(rs[0].body) != 0 {
				t.Fatalf("resize requests %+v; want one POST %s/resize?size=14 with no body", rs, igm)
			}
			if id := rs[0].query.Get("requestId"); !uuidRE.MatchString(id) {
				t.Errorf("resize requestId %q; want a UUID (version 4)", id)
			}
			if f.targetSize != 14 {
				t.Errorf("the fake holds targetSize %d; want 14", f.targetSize)
			}
			if n := len(requestsTo(f, epAutoscaler)); n != 0 {
				t.Errorf("%d autoscaler requests for a group without one", n)
			}
			before := len(requestsTo(f, epResize))
			if err := p.SetDesired(capCtx(t), 14); err != nil || len(requestsTo(f, epResize)) != before {
				t.Errorf("SetDesired to the size the group has: %v, %d more resize requests; want none", err, len(requestsTo(f, epResize))-before)
			}

			if err := p.Replace(capCtx(t), c.id); err != nil {
				t.Fatalf("Replace(%s): %v", c.id, err)
			}
			rs = requestsTo(f, epRecreate)
			want := `{"instances":["` + c.inst + `"]}`
			if len(rs) != 1 || rs[0].method != "POST" || rs[0].path != igm+"/recreateInstances" || string(rs[0].body) != want {
				t.Fatalf("recreateInstances requests %+v; want one POST %s/recreateInstances with %s", rs, igm, want)
			}
			if id := rs[0].query.Get("requestId"); !uuidRE.MatchString(id) {
				t.Errorf("recreateInstances requestId %q; want a UUID", id)
			}
			if !slices.Equal(f.recreated, []string{c.id}) || f.targetSize != 14 {
				t.Errorf("the fake recreated %v, targetSize %d; want [%s], 14", f.recreated, f.targetSize, c.id)
			}
		})
	}
	t.Run("a zonal instance's name is recreated without a lookup", func(t *testing.T) {
		f := newFake(t, "zonal")
		if err := f.provider(t, nil).Replace(capCtx(t), "gpu-mig-a003"); err != nil {
			t.Fatal(err)
		}
		if n := f.calls(epManaged); n != 0 {
			t.Errorf("%d listManagedInstances requests; want none", n)
		}
		if !slices.Equal(f.recreated, []string{"1003"}) {
			t.Errorf("recreated %v; want [1003]", f.recreated)
		}
	})
	t.Run("a host's ID after the host poll", func(t *testing.T) {
		f := newFake(t, "zonal")
		p := f.provider(t, nil)
		id := hosts(t, p)[0].ID
		if err := p.Replace(capCtx(t), id); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(f.recreated, []string{id}) {
			t.Errorf("recreated %v; want [%s]", f.recreated, id)
		}
		// The next poll asks the cloud again (Forget), and sees the host as leaving.
		for _, h := range hosts(t, p) {
			if h.ID == id && !h.Leaving {
				t.Errorf("after Replace, host %s is not leaving: %+v", id, h)
			}
		}
	})
	t.Run("a slow operation is waited for", func(t *testing.T) {
		f := newFake(t, "regional")
		f.opPending = 2
		if err := f.provider(t, nil).SetDesired(capCtx(t), 3); err != nil {
			t.Fatal(err)
		}
		ops := requestsTo(f, epOperation)
		if len(ops) != 2 || !strings.HasPrefix(ops[0].path, "/compute/v1/projects/test-project/regions/us-central1/operations/operation-") {
			t.Errorf("operation polls %+v; want 2 GETs of regions/us-central1/operations/NAME", ops)
		}
		if f.targetSize != 3 {
			t.Errorf("targetSize %d after the operation; want 3", f.targetSize)
		}
	})
	t.Run("polls go on while an operation is waited for, which ends with its context", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.opPending = 1000
		p := f.provider(t, nil)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- p.SetDesired(ctx, 4) }()
		for len(requestsTo(f, epOperation)) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		start := time.Now()
		hosts(t, p)
		if took := time.Since(start); took > time.Second {
			t.Errorf("a host poll during the wait took %v", took)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "for operation operation-") {
			t.Errorf("SetDesired whose context ended while waiting: %v; want one wrapping context.Canceled", err)
		}
	})
	t.Run("a retried resize carries the same requestId and is done once", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.script(epResize, errorReply(t, 429, "errors/429.json", "1"))
		if err := f.provider(t, nil).SetDesired(capCtx(t), 2); err != nil {
			t.Fatal(err)
		}
		rs := requestsTo(f, epResize)
		if len(rs) != 2 || rs[0].query.Get("requestId") != rs[1].query.Get("requestId") {
			t.Errorf("resize requests %+v; want two with the same requestId", rs)
		}
		if len(f.operations) != 1 || f.targetSize != 2 {
			t.Errorf("%d operations, targetSize %d; want 1 and 2", len(f.operations), f.targetSize)
		}
	})
}

func TestAutoscaler(t *testing.T) {
	for _, c := range []struct {
		mode     string
		want     providers.GroupSize
		refused  bool
		autoscal bool
	}{
		{"ON", providers.GroupSize{Desired: 9, Min: 2, Max: 12, Instances: 11}, true, true},
		{"", providers.GroupSize{Desired: 9, Min: 2, Max: 12, Instances: 11}, true, true}, // no mode: ON
		{"ONLY_SCALE_OUT", providers.GroupSize{Desired: 9, Min: 2, Max: 12, Instances: 11}, true, true},
		{"OFF", providers.GroupSize{Desired: 9, Min: 0, Max: 12, Instances: 11}, false, false},
	} {
		t.Run(cmpOr(c.mode, "default"), func(t *testing.T) {
			f := newFake(t, "zonal")
			f.autoscaler = autoscaler(c.mode, 2, 12)
			p := f.provider(t, nil)
			s, err := p.GroupSize(capCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			got := s
			got.Autoscaled = ""
			if got != c.want {
				t.Errorf("GroupSize %+v; want %+v", s, c.want)
			}
			if c.autoscal != strings.Contains(s.Autoscaled, "projects/test-project/zones/us-central1-a/autoscalers/gpu-mig-as") {
				t.Errorf("Autoscaled %q; want it to name the autoscaler: %v", s.Autoscaled, c.autoscal)
			}
			if as := requestsTo(f, epAutoscaler); len(as) != 1 || as[0].path != "/compute/v1/projects/test-project/zones/us-central1-a/autoscalers/gpu-mig-as" {
				t.Errorf("autoscaler requests %+v; want one GET of zones/us-central1-a/autoscalers/gpu-mig-as", as)
			}

			err = p.SetDesired(capCtx(t), 10)
			if got := errors.Is(err, providers.ErrRefused); got != c.refused {
				t.Fatalf("SetDesired(10) with an autoscaler in mode %q: %v; want refused: %v", c.mode, err, c.refused)
			}
			if c.refused {
				for _, s := range []string{"mode to OFF", "delete it", "autoscalers/gpu-mig-as"} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("the refusal %q does not say %q", err, s)
					}
				}
				if n := len(requestsTo(f, epResize)); n != 0 {
					t.Errorf("%d resize requests to an autoscaled group; want none", n)
				}
				return
			}
			if f.targetSize != 10 {
				t.Errorf("targetSize %d; want 10", f.targetSize)
			}
			err = p.SetDesired(capCtx(t), 13)
			if !errors.Is(err, providers.ErrAboveMax) || len(requestsTo(f, epResize)) != 1 {
				t.Errorf("SetDesired(13) above maxNumReplicas 12: %v, %d resize requests; want ErrAboveMax and no request", err, len(requestsTo(f, epResize))-1)
			}
		})
	}
}

func cmpOr(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func TestCapacityErrors(t *testing.T) {
	replace := func(id string) func(*gcp.Provider) error {
		return func(p *gcp.Provider) error { return p.Replace(t.Context(), id) }
	}
	setDesired := func(p *gcp.Provider) error { return p.SetDesired(t.Context(), 10) }
	for _, c := range []struct {
		name  string
		dir   string
		setup func(*fakeCompute)
		call  func(*gcp.Provider) error
		is    error    // errors.Is target; nil: neither ErrRefused nor ErrNotInGroup
		says  []string // substrings of the error
		never string   // an endpoint that must not be called
	}{
		{name: "get denied", setup: func(f *fakeCompute) { f.script(epGroup, errorReply(t, 403, "errors/403.json", "")) },
			call: func(p *gcp.Provider) error { _, err := p.GroupSize(t.Context()); return err },
			is:   providers.ErrRefused, says: []string{"gcp: MIG \"gpu-mig\"", "needs compute.instanceGroupManagers.get", "Required 'compute.instanceGroupManagers.get' permission"}},
		{name: "autoscaler denied", setup: func(f *fakeCompute) {
			f.autoscaler = autoscaler("OFF", 0, 20)
			f.script(epAutoscaler, errorReply(t, 403, "errors/403-autoscaler.json", ""))
		}, call: setDesired, is: providers.ErrRefused, says: []string{"needs compute.autoscalers.get"}, never: epResize},
		{name: "resize denied", setup: func(f *fakeCompute) { f.denied = true }, call: setDesired,
			is: providers.ErrRefused, says: []string{"resize to 10 refused (needs compute.instanceGroupManagers.update)", "Required 'compute.instanceGroupManagers.update' permission"}},
		{name: "recreate denied", setup: func(f *fakeCompute) { f.denied = true }, call: replace("1001"),
			is: providers.ErrRefused, says: []string{"replace instance 1001", "needs compute.instanceGroupManagers.update"}},
		{name: "recreate denied, regional", dir: "regional", setup: func(f *fakeCompute) { f.script(epRecreate, errorReply(t, 403, "errors/403-update.json", "")) },
			call: replace("3001"), is: providers.ErrRefused, says: []string{"needs compute.instanceGroupManagers.update"}},
		{name: "listErrors denied", setup: func(f *fakeCompute) { f.script(epErrors, errorReply(t, 403, "errors/403.json", "")) },
			call: func(p *gcp.Provider) error { _, err := p.LaunchFailures(t.Context()); return err },
			is:   providers.ErrRefused, says: []string{"listErrors", "needs compute.instanceGroupManagers.get"}},
		{name: "operation denied", setup: func(f *fakeCompute) {
			f.opFailure = &opFailure{403, "FORBIDDEN", "PERMISSION_DENIED", "Required 'compute.instances.create' permission for 'projects/test-project/zones/us-central1-a/instances/gpu-mig-a001'"}
		}, call: replace("1001"), is: providers.ErrRefused, says: []string{"compute.instances.create", "operation operation-"}},
		{name: "a rate-limit 403 is not a refusal", setup: func(f *fakeCompute) { f.script(epResize, errorReply(t, 403, "errors/403-rate.json", "")) },
			call: setDesired, is: gcp.ErrThrottled},
		{name: "an instance of the zone, not of the group", call: replace("gpu-mig-a0-unmanaged"),
			is: providers.ErrNotInGroup, says: []string{"is not a member of the instance group manager"}},
		{name: "no such instance", call: replace("no-such-vm"), is: providers.ErrNotInGroup, says: []string{"was not found"}},
		{name: "not a member (scripted)", setup: func(f *fakeCompute) { f.script(epRecreate, errorReply(t, 400, "errors/400-not-member.json", "")) },
			call: replace("gpu-mig-a001"), is: providers.ErrNotInGroup},
		{name: "an ID not in the group", call: replace("999999"), is: providers.ErrNotInGroup, never: epRecreate},
		{name: "a regional name not in the group", dir: "regional", call: replace("gpu-rmig-zz"), is: providers.ErrNotInGroup, never: epRecreate},
		{name: "not an instance", call: replace("../x"), is: providers.ErrNotInGroup, never: epRecreate},
		{name: "the group is gone", setup: func(f *fakeCompute) { f.script(epRecreate, errorReply(t, 404, "errors/404.json", "")) },
			call: replace("gpu-mig-a001"), says: []string{"no-such-mig' was not found"}},
		{name: "the operation fails", setup: func(f *fakeCompute) {
			f.opFailure = &opFailure{400, "BAD REQUEST", "QUOTA_EXCEEDED", "Quota 'NVIDIA_H100_GPUS' exceeded.  Limit: 8.0 in region us-central1."}
		}, call: setDesired, says: []string{"QUOTA_EXCEEDED: Quota 'NVIDIA_H100_GPUS' exceeded", "HTTP 400"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, cmpOr(c.dir, "zonal"))
			if c.setup != nil {
				c.setup(f)
			}
			err := c.call(f.provider(t, nil))
			if err == nil {
				t.Fatal("no error")
			}
			switch {
			case c.is != nil && !errors.Is(err, c.is):
				t.Errorf("error %v; want one wrapping %v", err, c.is)
			case c.is == nil && (errors.Is(err, providers.ErrRefused) || errors.Is(err, providers.ErrNotInGroup)):
				t.Errorf("error %v is a refusal or not-in-group; want neither", err)
			}
			if !strings.HasPrefix(err.Error(), "gcp: MIG \"gpu-mig\"") || strings.Count(err.Error(), "gcp: ") != 1 {
				t.Errorf("error %q: want the prefix once", err)
			}
			for _, s := range c.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if c.never != "" && f.calls(c.never) != 0 {
				t.Errorf("%d requests to %s; want none", f.calls(c.never), c.never)
			}
			t.Logf("%v", err)
		})
	}
}

func TestLaunchFailures(t *testing.T) {
	f := newFake(t, "regional")
	f.pageSize = 2 // the errors come in pages
	now := time.Now()
	inst := func(zone, name string) string { return apiBase + testProject + "/zones/" + zone + "/instances/" + name }
	f.igmErrors = []*computepb.InstanceManagedByIgmError{
		igmError(now.Add(-3*time.Minute), "CREATING", inst("us-central1-b", "gpu-rmig-q1"), "QUOTA_EXCEEDED", "Quota 'PREEMPTIBLE_NVIDIA_L4_GPUS' exceeded.  Limit: 16.0 in region us-central1."),
		igmError(now.Add(-10*time.Minute), "CREATING", inst("us-central1-a", "gpu-rmig-x1"), "ZONE_RESOURCE_POOL_EXHAUSTED", stockoutMessage("us-central1-a")),
		igmError(now.Add(-2*time.Hour), "CREATING", inst("us-central1-a", "gpu-rmig-old"), "ZONE_RESOURCE_POOL_EXHAUSTED", stockoutMessage("us-central1-a")),
		igmError(now.Add(-1*time.Minute), "CREATING", inst("us-central1-c", "gpu-rmig-ip"), "IP_SPACE_EXHAUSTED", "IP space of 'projects/test-project/regions/us-central1/subnetworks/default' is exhausted."),
		igmError(now.Add(-8*time.Minute), "CREATING_WITHOUT_RETRIES", inst("us-central1-c", "gpu-rmig-x2"), "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "The zone 'projects/test-project/zones/us-central1-c' does not have enough resources available to fulfill the request. '(resource type:compute)'."),
		igmError(now.Add(-6*time.Minute), "RECREATING", inst("us-central1-b", "gpu-rmig-b0"), "RESOURCE_POOL_EXHAUSTED", "The zone 'projects/test-project/zones/us-central1-b' does not have enough resources available to fulfill the request."),
		igmError(now.Add(-5*time.Minute), "DELETING", inst("us-central1-b", "gpu-rmig-b9"), "RESOURCE_NOT_READY", "The resource is not ready."),
	}
	fs, err := f.provider(t, nil).LaunchFailures(capCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		code, zone, name string
		kind             providers.FailureKind
	}
	wants := []want{ // newest last; not the 2-hour-old one, nor the DELETING one
		{"ZONE_RESOURCE_POOL_EXHAUSTED", "us-central1-a", "gpu-rmig-x1", providers.NoCapacity},
		{"ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "us-central1-c", "gpu-rmig-x2", providers.NoCapacity},
		{"RESOURCE_POOL_EXHAUSTED", "us-central1-b", "gpu-rmig-b0", providers.NoCapacity},
		{"QUOTA_EXCEEDED", "us-central1-b", "gpu-rmig-q1", providers.Quota},
		{"IP_SPACE_EXHAUSTED", "us-central1-c", "gpu-rmig-ip", providers.OtherFailure},
	}
	if len(fs) != len(wants) {
		t.Fatalf("LaunchFailures = %+v; want %d", fs, len(wants))
	}
	for i, w := range wants {
		got := fs[i]
		e := f.igmErrors[slices.IndexFunc(f.igmErrors, func(e *computepb.InstanceManagedByIgmError) bool {
			return strings.HasSuffix(e.GetInstanceActionDetails().GetInstance(), "/"+w.name)
		})]
		wantID := fmt.Sprintf("%s projects/test-project/zones/%s/instances/%s %s", e.GetTimestamp(), w.zone, w.name, w.code)
		if got.Code != w.code || got.Zone != w.zone || got.Kind != w.kind || got.ID != wantID ||
			got.Message != e.GetError().GetMessage() || !got.At.Equal(at(e.GetTimestamp())) {
			t.Errorf("failure %d = %+v; want code %s, zone %s, kind %s, ID %q", i, got, w.code, w.zone, w.kind, wantID)
		}
	}
	rs := requestsTo(f, epErrors)
	if len(rs) != 4 || rs[0].path != "/compute/v1/projects/test-project/regions/us-central1/instanceGroupManagers/gpu-mig/listErrors" {
		t.Errorf("listErrors requests %+v; want 4 pages of 2 from regions/us-central1/…/listErrors", rs)
	}
	for _, r := range rs {
		if r.query.Has("filter") || r.query.Has("orderBy") || r.query.Get("maxResults") != "500" {
			t.Errorf("listErrors query %v; want maxResults=500, no filter or orderBy (not supported)", r.query)
		}
	}
}

// The stockout the harness makes reads back as the API reports it, in a zonal group too.
func TestRunOutZonal(t *testing.T) {
	f := newFake(t, "zonal")
	f.runOut()
	fs, err := f.provider(t, nil).LaunchFailures(capCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	// testdata/zonal creates a004 (no VM yet) and a005.
	if len(fs) != 2 || fs[0].Code != "ZONE_RESOURCE_POOL_EXHAUSTED" || fs[0].Kind != providers.NoCapacity || fs[0].Zone != testZone ||
		!strings.Contains(fs[0].ID+fs[1].ID, "instances/gpu-mig-a004") {
		t.Errorf("LaunchFailures after a stockout = %+v; want a004 and a005's ZONE_RESOURCE_POOL_EXHAUSTED in %s", fs, testZone)
	}
}
