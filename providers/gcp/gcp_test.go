package gcp_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/gcp"
	"github.com/elasticd/elasticd/providers/providertest"
	"google.golang.org/protobuf/proto"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

// zonalWant is what testdata/zonal lists: its running instances, and those being deleted,
// stopped or recreated as Leaving. Not listed: a001's neighbours with no instance yet (a004),
// no IP yet (a005), still STAGING (a008) or already gone from the zone (a010), and the
// zone's instances that are not in the group.
var zonalWant = []providers.Host{
	{ID: "1001", Addr: "10.128.0.11", Slots: 8, Zone: testZone, Spot: true, Type: "a2-highgpu-8g", Launched: at("2026-03-01T10:00:01.250-08:00")},
	{ID: "1002", Addr: "10.128.0.12", Slots: 2, Zone: testZone, Spot: true, Type: "g2-standard-24", Launched: at("2026-03-01T10:00:02-08:00")},
	{ID: "1003", Addr: "10.128.0.13", Slots: 4, Zone: testZone, Type: "n1-standard-16", Launched: at("2026-03-01T10:00:03-08:00")},
	{ID: "1006", Addr: "10.128.0.16", Slots: 8, Zone: testZone, Spot: true, Type: "a3-highgpu-8g", Launched: at("2026-03-01T10:00:06-08:00"), Leaving: true},
	{ID: "1007", Addr: "10.128.0.17", Slots: 8, Zone: testZone, Spot: true, Type: "a3-highgpu-8g", Launched: at("2026-03-01T10:00:07-08:00"), Leaving: true},
	{ID: "1009", Addr: "10.128.0.19", Slots: 8, Zone: testZone, Spot: true, Type: "a3-highgpu-8g", Launched: at("2026-03-01T10:00:09-08:00"), Leaving: true},
	{ID: "1011", Addr: "10.128.0.21", Slots: 1, Zone: testZone, Type: "e2-standard-4", Launched: at("2026-03-01T10:00:11-08:00")},
}

func regionalWant() []providers.Host {
	h := func(id, ip, zone, launched string) providers.Host {
		return providers.Host{ID: id, Addr: ip, Slots: 4, Zone: zone, Spot: true, Type: "g2-standard-48", Launched: at(launched)}
	}
	return []providers.Host{
		h("3001", "10.128.1.1", "us-central1-a", "2026-03-02T08:00:02Z"),
		h("3002", "10.128.1.2", "us-central1-a", "2026-03-02T08:00:03Z"),
		h("3003", "10.128.2.1", "us-central1-b", "2026-03-02T08:00:04Z"),
		h("3004", "10.128.3.1", "us-central1-c", "2026-03-02T08:00:05Z"),
		h("3005", "10.128.3.2", "us-central1-c", "2026-03-02T08:00:06Z"),
		{ID: "3099", Addr: "fd20:abcd:1234::9", Slots: 1, Zone: "us-central1-b", Type: "g2-standard-4", Launched: at("2026-03-02T08:00:09Z")},
	}
}

// sameHosts compares as sets by ID, every field including Leaving.
func sameHosts(t *testing.T, what string, got, want []providers.Host) {
	t.Helper()
	byID := func(a, b providers.Host) int { return cmp.Compare(a.ID, b.ID) }
	g, w := slices.SortedFunc(slices.Values(got), byID), slices.SortedFunc(slices.Values(want), byID)
	if !slices.EqualFunc(g, w, func(a, b providers.Host) bool { return providers.SameHost(a, b) && a.Leaving == b.Leaving }) {
		t.Errorf("%s:\n got  %+v\n want %+v", what, g, w)
	}
}

func hosts(t *testing.T, p *gcp.Provider) []providers.Host {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	hs, err := p.Hosts(ctx)
	if err != nil {
		t.Fatalf("Hosts: %v", err)
	}
	return hs
}

func hostsErr(t *testing.T, p *gcp.Provider, timeout time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	hs, err := p.Hosts(ctx)
	if err == nil {
		t.Fatalf("Hosts: no error, hosts %v", hs)
	}
	if len(hs) != 0 {
		t.Errorf("Hosts returned hosts %v with its error", hs)
	}
	t.Logf("the error reads: %v", err)
	return err
}

func wantIn(t *testing.T, err error, parts ...string) {
	t.Helper()
	for _, s := range parts {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func TestConformance(t *testing.T) {
	for _, dir := range []string{"zonal", "regional"} {
		t.Run(dir, func(t *testing.T) {
			providertest.Run(t, providertest.Harness{NewGroup: func(t *testing.T) providertest.Group {
				f := newFake(t, dir)
				want := zonalWant
				if dir == "regional" {
					want = regionalWant()
				}
				return providertest.Group{
					Provider: f.provider(t, nil),
					Want:     want,
					Change: func(t *testing.T) []providers.Host {
						// The first host is deleted; a new one joins in its zone.
						gone := want[0]
						var zone string
						f.change(func(f *fakeCompute) {
							f.managed = slices.DeleteFunc(f.managed, func(mi *computepb.ManagedInstance) bool {
								return fmt.Sprint(mi.GetId()) == gone.ID
							})
							zone = gone.Zone
							m, in := bigGroup(testProject, []string{zone}, 1)
							f.managed = append(f.managed, m...)
							f.instances[zone] = append(f.instances[zone], in[zone]...)
						})
						added := providers.Host{ID: "5000000", Addr: "10.64.0.0", Slots: 8, Zone: zone, Spot: true,
							Type: "a3-highgpu-8g", Launched: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
						return append(slices.Clone(want[1:]), added)
					},
					Fail:  func(t *testing.T) { f.change(func(f *fakeCompute) { f.broken = true }) },
					Stall: func(t *testing.T) { f.change(func(f *fakeCompute) { f.stalled = true }) },
				}
			}})
		})
	}
}

func TestZonalGroup(t *testing.T) {
	f := newFake(t, "zonal")
	p := f.provider(t, nil)
	sameHosts(t, "zonal group", hosts(t, p), zonalWant)

	log := f.log()
	if len(log) != 2 || log[0].endpoint != epManaged || log[1].endpoint != epInstances || log[1].zone != testZone {
		t.Fatalf("requests %+v; want one managed list, then one instances list in %s", log, testZone)
	}
	if got := log[0].query.Get("maxResults"); got != "500" {
		t.Errorf("listManagedInstances maxResults=%q; want the API's largest page, 500", got)
	}
	if got, want := log[1].query.Get("filter"), `name eq "gpu-mig-a0.*"`; got != want {
		t.Errorf("instances filter %q; want %q (the managed instances' common name prefix)", got, want)
	}
	if got := log[1].query.Get("maxResults"); got != "500" {
		t.Errorf("instances maxResults=%q; want 500", got)
	}
	for _, r := range log {
		if !strings.Contains(r.fieldMask, "nextPageToken") {
			t.Errorf("%s request asked for fields %q; want a field mask that keeps nextPageToken", r.endpoint, r.fieldMask)
		}
	}
}

func TestRegionalGroup(t *testing.T) {
	f := newFake(t, "regional")
	p := f.provider(t, nil)
	sameHosts(t, "regional group", hosts(t, p), regionalWant())
	var zones []string
	for _, r := range f.log() {
		if r.endpoint == epInstances {
			zones = append(zones, r.zone)
		}
	}
	if want := []string{"us-central1-a", "us-central1-b", "us-central1-c"}; !slices.Equal(zones, want) {
		t.Errorf("instances listed in zones %v; want one list in each of %v", zones, want)
	}
	if n := f.calls(epManaged); n != 1 {
		t.Errorf("%d listManagedInstances requests; want 1", n)
	}
}

func TestPagination(t *testing.T) {
	for _, c := range []struct {
		name      string
		paginated bool
		pageSize  int
		managed   int // requests expected
		instances int
	}{
		{"pageless MIG, instance pages of 2", false, 2, 1, 5}, // 10 matching instances (a0-unmanaged included)
		{"paginated MIG, pages of 2", true, 2, 6, 5},
		{"paginated MIG, pages of 3", true, 3, 4, 4},
		{"pages of 1", true, 1, 11, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, "zonal")
			f.change(func(f *fakeCompute) { f.paginated, f.pageSize = c.paginated, c.pageSize })
			p := f.provider(t, nil)
			sameHosts(t, "hosts over pages", hosts(t, p), zonalWant)
			if m, i := f.calls(epManaged), f.calls(epInstances); m != c.managed || i != c.instances {
				t.Errorf("requests: %d managed, %d instances; want %d and %d", m, i, c.managed, c.instances)
			}
		})
	}
}

func TestPageTokenLoop(t *testing.T) {
	f := newFake(t, "zonal")
	body := []byte(`{"managedInstances":[],"nextPageToken":"again"}`)
	ok := reply{status: 200, header: http.Header{"Content-Type": {"application/json"}}, body: body}
	f.script(epManaged, ok, ok, ok)
	err := hostsErr(t, f.provider(t, nil), 10*time.Second)
	wantIn(t, err, testMIG, "page token", "twice")
	if n := f.calls(epManaged); n != 2 {
		t.Errorf("%d requests; want 2 (the second repeats the token)", n)
	}
}

func TestThrottling(t *testing.T) {
	t.Run("Retry-After is waited for, then the poll goes on", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.script(epInstances, errorReply(t, 429, "errors/429.json", "1"))
		p := f.provider(t, nil)
		start := time.Now()
		sameHosts(t, "after a 429", hosts(t, p), zonalWant)
		if took := time.Since(start); took < time.Second {
			t.Errorf("the poll took %v; it should have waited the 1s the server asked for", took)
		}
		var inst []time.Time
		for _, r := range f.log() {
			if r.endpoint == epInstances {
				inst = append(inst, r.at)
			}
		}
		if len(inst) != 2 || inst[1].Sub(inst[0]) < time.Second {
			t.Fatalf("instances requests at %v; want two, 1s apart", inst)
		}
		// The throttled endpoint's gate is open again and the other was never closed: the
		// next poll asks both at once.
		start = time.Now()
		hosts(t, p)
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Errorf("the next poll took %v; nothing should hold it back", took)
		}
	})
	t.Run("a 403 rate limit is throttling too", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.script(epManaged, errorReply(t, 403, "errors/403-rate.json", "1"))
		sameHosts(t, "after a rate-limit 403", hosts(t, f.provider(t, nil)), zonalWant)
		if n := f.calls(epManaged); n != 2 {
			t.Errorf("%d managed requests; want 2", n)
		}
	})
	t.Run("Retry-After as an HTTP date", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.script(epManaged, errorReply(t, 503, "errors/503.json", time.Now().Add(2*time.Second).UTC().Format(http.TimeFormat)))
		start := time.Now()
		sameHosts(t, "after a 503", hosts(t, f.provider(t, nil)), zonalWant)
		if took := time.Since(start); took < 900*time.Millisecond {
			t.Errorf("the poll took %v; it should have waited until the date the server gave", took)
		}
	})
	t.Run("a long Retry-After fails fast and closes only that endpoint", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.script(epInstances, errorReply(t, 429, "errors/429.json", "120"))
		p := f.provider(t, nil)
		start := time.Now()
		err := hostsErr(t, p, 5*time.Second)
		if !errors.Is(err, gcp.ErrThrottled) {
			t.Errorf("error %v does not wrap ErrThrottled", err)
		}
		wantIn(t, err, testMIG, "instances.list")
		// The next poll asks the managed list (its gate is open) but not the throttled one.
		err = hostsErr(t, p, 5*time.Second)
		if !errors.Is(err, gcp.ErrThrottled) {
			t.Errorf("second poll: error %v does not wrap ErrThrottled", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("two throttled polls took %v; they must not wait out a 120s Retry-After", took)
		}
		if m, i := f.calls(epManaged), f.calls(epInstances); m != 2 || i != 1 {
			t.Errorf("requests: %d managed, %d instances; want 2 and 1", m, i)
		}
	})
	t.Run("no Retry-After: fail, back off, recover", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.script(epManaged, errorReply(t, 503, "errors/503.json", ""))
		p := f.provider(t, nil)
		err := hostsErr(t, p, 5*time.Second)
		if !errors.Is(err, gcp.ErrThrottled) {
			t.Errorf("error %v does not wrap ErrThrottled", err)
		}
		// Within the backoff (1s) a poll that cannot wait it out does not ask.
		hostsErr(t, p, 600*time.Millisecond)
		if n := f.calls(epManaged); n != 1 {
			t.Errorf("%d requests within the backoff; want 1", n)
		}
		// One with time to wait does, once the backoff is over.
		sameHosts(t, "after the backoff", hosts(t, p), zonalWant)
		if n := f.calls(epManaged); n != 2 {
			t.Errorf("%d requests; want 2", n)
		}
	})
	t.Run("tries per page are bounded", func(t *testing.T) {
		f := newFake(t, "zonal")
		for range 10 {
			f.script(epManaged, errorReply(t, 429, "errors/429.json", "0"))
		}
		err := hostsErr(t, f.provider(t, nil), 5*time.Second)
		if !errors.Is(err, gcp.ErrThrottled) {
			t.Errorf("error %v does not wrap ErrThrottled", err)
		}
		if n := f.calls(epManaged); n != 3 {
			t.Errorf("%d requests; want 3 tries", n)
		}
	})
}

func TestMalformedResponses(t *testing.T) {
	ok := func(file string) reply {
		return reply{status: 200, header: http.Header{"Content-Type": {"application/json"}}, body: readFile(t, filepath.Join("malformed", file))}
	}
	for _, c := range []struct {
		name     string
		endpoint string
		reply    reply
	}{
		{"truncated JSON", epManaged, ok("truncated.json")},
		{"wrong type", epManaged, ok("wrong-type.json")},
		{"HTML with status 200", epManaged, ok("html.json")},
		{"HTML with status 502", epManaged, reply{status: 502, header: http.Header{"Content-Type": {"text/html"}}, body: readFile(t, "malformed/html.json")}},
		{"empty body", epManaged, ok("empty.json")},
		{"an id that is not a number", epManaged, ok("bad-id.json")},
		{"instances of the wrong type", epInstances, ok("instances-wrong-type.json")},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, "zonal")
			f.script(c.endpoint, c.reply)
			err := hostsErr(t, f.provider(t, nil), 5*time.Second)
			wantIn(t, err, testMIG, testProject)
		})
	}
	t.Run("a 500 on a later page", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.change(func(f *fakeCompute) { f.pageSize = 2 })
		f.script(epInstances, reply{model: true}, errorReply(t, 500, "errors/500.json", ""))
		err := hostsErr(t, f.provider(t, nil), 5*time.Second)
		wantIn(t, err, testMIG, testProject, `zone "us-central1-a"`, "500")
		if n := f.calls(epInstances); n != 2 {
			t.Errorf("%d instances requests; want 2", n)
		}
	})
}

func TestPartialRecords(t *testing.T) {
	// Records with fields missing or odd are skipped one by one; the rest are listed.
	f := newFake(t, "zonal")
	f.change(func(f *fakeCompute) {
		base := "https://www.googleapis.com/compute/v1/projects/test-project/zones/us-central1-a/instances/"
		f.managed = append(f.managed,
			&computepb.ManagedInstance{Name: proto.String("odd-url"), Instance: proto.String("not-a-url"), Id: proto.Uint64(7001)},
			&computepb.ManagedInstance{Name: proto.String("gpu-mig-a0-nonic"), Instance: proto.String(base + "gpu-mig-a0-nonic"), Id: proto.Uint64(7002)},
			&computepb.ManagedInstance{Name: proto.String("gpu-mig-a0-noid"), Instance: proto.String(base + "gpu-mig-a0-noid")},
			&computepb.ManagedInstance{Name: proto.String("gpu-mig-a0-bare"), Instance: proto.String(base + "gpu-mig-a0-bare"), Id: proto.Uint64(7004)},
		)
		f.instances[testZone] = append(f.instances[testZone],
			&computepb.Instance{Name: proto.String("gpu-mig-a0-nonic"), Id: proto.Uint64(7002), Status: proto.String("RUNNING")},
			&computepb.Instance{Name: proto.String("gpu-mig-a0-noid"), Status: proto.String("RUNNING"),
				NetworkInterfaces: []*computepb.NetworkInterface{{NetworkIP: proto.String("10.128.0.77")}}},
			// Only a name, an ID, a status and an address: no zone, type, scheduling or time.
			&computepb.Instance{Name: proto.String("gpu-mig-a0-bare"), Id: proto.Uint64(7004), Status: proto.String("RUNNING"),
				NetworkInterfaces: []*computepb.NetworkInterface{{NetworkIP: proto.String("10.128.0.78")}},
				CreationTimestamp: proto.String("yesterday")},
		)
	})
	want := append(slices.Clone(zonalWant), providers.Host{ID: "7004", Addr: "10.128.0.78", Slots: 1})
	sameHosts(t, "hosts with partial records", hosts(t, f.provider(t, nil)), want)
}

func TestGroupNotFound(t *testing.T) {
	for _, c := range []struct {
		name  string
		edit  func(*gcp.Config)
		parts []string
	}{
		{"zonal", func(c *gcp.Config) { c.MIG = "no-such-mig" },
			[]string{`"no-such-mig"`, `"test-project"`, `zone "us-central1-a"`, "not found", "--mig", "--zone", "--region"}},
		{"regional", func(c *gcp.Config) { c.MIG = "no-such-mig"; c.Zone = ""; c.Region = testRegion },
			[]string{`"no-such-mig"`, `region "us-central1"`, "not found", "--region", "--zone"}},
		{"wrong project", func(c *gcp.Config) { c.Project = "other-project" },
			[]string{`"gpu-mig"`, `"other-project"`, "--project"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, "zonal")
			err := hostsErr(t, f.provider(t, c.edit), 5*time.Second)
			wantIn(t, err, c.parts...)
		})
	}
}

func TestAuthFailure(t *testing.T) {
	for _, c := range []struct {
		status int
		file   string
		parts  []string
	}{
		{401, "errors/401.json", []string{"credentials", "401", "GOOGLE_APPLICATION_CREDENTIALS"}},
		{403, "errors/403.json", []string{"permission denied", "compute.instances.list", "roles/compute.viewer"}},
	} {
		t.Run(fmt.Sprint(c.status), func(t *testing.T) {
			f := newFake(t, "zonal")
			f.script(epManaged, errorReply(t, c.status, c.file, ""))
			err := hostsErr(t, f.provider(t, nil), 5*time.Second)
			wantIn(t, err, append(c.parts, `"gpu-mig"`, `"test-project"`, `"us-central1-a"`)...)
			if errors.Is(err, gcp.ErrThrottled) {
				t.Errorf("%d is not throttling: %v", c.status, err)
			}
		})
	}
}

func TestMissingCredentials(t *testing.T) {
	// The default chain with a key file that is not there: the first poll says so, names the
	// group and how to fix it, and asks no API.
	f := newFake(t, "zonal")
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "missing-key.json"))
	err := hostsErr(t, f.provider(t, func(c *gcp.Config) { c.ClientOptions = nil }), 5*time.Second)
	wantIn(t, err, `"gpu-mig"`, `"test-project"`, "credentials", "gcloud auth application-default login")
	if n := f.calls(""); n != 0 {
		t.Errorf("%d API requests without credentials; want 0", n)
	}
}

func TestEndpointOverride(t *testing.T) {
	f := newFake(t, "zonal")
	// A trailing slash is the same root.
	p := f.provider(t, func(c *gcp.Config) { c.Endpoint = f.srv.URL + "/" })
	sameHosts(t, "endpoint with a trailing slash", hosts(t, p), zonalWant)
	if n := f.calls(""); n != 2 {
		t.Errorf("%d requests reached the endpoint; want 2", n)
	}
}

func TestSlots(t *testing.T) {
	for _, c := range []struct {
		typ      string
		accels   int32
		override int
		want     int
	}{
		{"a2-highgpu-8g", 0, 0, 8},
		{"a2-megagpu-16g", 0, 0, 16},
		{"a3-highgpu-8g", 0, 0, 8},
		{"a3-megagpu-8g", 0, 0, 8},
		{"a4-highgpu-8g", 0, 0, 8},
		{"g2-standard-4", 0, 0, 1},
		{"g2-standard-24", 0, 0, 2},
		{"g2-standard-48", 0, 0, 4},
		{"g2-standard-96", 0, 0, 8},
		{"n1-standard-8", 2, 0, 2},   // attached GPUs are the instance's own
		{"a2-highgpu-8g", 4, 0, 4},   // the instance's accelerators win over the table
		{"e2-standard-4", 0, 0, 1},   // no GPU: one slot
		{"a3-highgpu-8g", 8, 3, 3},   // --slots-per-host wins
		{"e2-standard-4", 0, 16, 16}, // even without GPUs
	} {
		t.Run(fmt.Sprintf("%s+%d/%d", c.typ, c.accels, c.override), func(t *testing.T) {
			f := newFake(t, "")
			f.change(func(f *fakeCompute) {
				m, in := bigGroup(testProject, []string{testZone}, 1)
				in[testZone][0].MachineType = proto.String("zones/us-central1-a/machineTypes/" + c.typ)
				if c.accels > 0 {
					in[testZone][0].GuestAccelerators = []*computepb.AcceleratorConfig{{AcceleratorCount: proto.Int32(c.accels)}}
				}
				f.managed, f.instances = m, in
			})
			hs := hosts(t, f.provider(t, func(cfg *gcp.Config) { cfg.SlotsPerHost = c.override }))
			if len(hs) != 1 || hs[0].Slots != c.want || hs[0].Type != c.typ {
				t.Errorf("hosts %+v; want one %s with %d slots", hs, c.typ, c.want)
			}
		})
	}
}

func TestMinInterval(t *testing.T) {
	t.Run("polls within the interval use the last answer", func(t *testing.T) {
		f := newFake(t, "zonal")
		p := f.provider(t, func(c *gcp.Config) { c.MinInterval = time.Hour })
		for range 5 {
			sameHosts(t, "cached poll", hosts(t, p), zonalWant)
		}
		if n := f.calls(""); n != 2 {
			t.Errorf("%d requests for 5 polls; want 2 (one poll)", n)
		}
	})
	t.Run("the default is 5s", func(t *testing.T) {
		f := newFake(t, "zonal")
		p := f.provider(t, func(c *gcp.Config) { c.MinInterval = 0 })
		hosts(t, p)
		hosts(t, p)
		if n := f.calls(""); n != 2 {
			t.Errorf("%d requests for 2 polls in a row; want 2 (one poll)", n)
		}
	})
	t.Run("after the interval the API is asked again", func(t *testing.T) {
		f := newFake(t, "zonal")
		p := f.provider(t, func(c *gcp.Config) { c.MinInterval = 100 * time.Millisecond })
		hosts(t, p)
		hosts(t, p)
		time.Sleep(150 * time.Millisecond)
		hosts(t, p)
		if n := f.calls(""); n != 4 {
			t.Errorf("%d requests; want 4 (two polls)", n)
		}
	})
	t.Run("concurrent polls share one", func(t *testing.T) {
		f := newFake(t, "zonal")
		p := f.provider(t, func(c *gcp.Config) { c.MinInterval = time.Hour })
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				hs, err := p.Hosts(t.Context())
				if err != nil {
					t.Errorf("Hosts: %v", err)
				}
				sameHosts(t, "concurrent poll", hs, zonalWant)
			})
		}
		wg.Wait()
		if n := f.calls(""); n != 2 {
			t.Errorf("%d requests for 8 concurrent polls; want 2 (one poll)", n)
		}
	})
	t.Run("a failed poll is not cached", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.script(epManaged, errorReply(t, 500, "errors/500.json", ""))
		p := f.provider(t, func(c *gcp.Config) { c.MinInterval = time.Hour })
		hostsErr(t, p, 5*time.Second)
		sameHosts(t, "after a failure", hosts(t, p), zonalWant)
	})
}

func TestCallsGrowWithPagesNotInstances(t *testing.T) {
	// At the API's largest page, 10,000 instances in one zone take 20 + 20 requests and 1,000
	// take 2 + 2; one request per instance would be thousands.
	for _, c := range []struct {
		n, zones, want int
	}{
		{1000, 1, 4},
		{10000, 1, 40},
		{10000, 3, 20 + 3*7},
	} {
		t.Run(fmt.Sprintf("%d in %d zones", c.n, c.zones), func(t *testing.T) {
			f := newFake(t, "")
			zones := []string{"us-central1-a", "us-central1-b", "us-central1-c"}[:c.zones]
			f.change(func(f *fakeCompute) {
				f.zone, f.region = "", testRegion
				f.paginated = true
				f.managed, f.instances = bigGroup(testProject, zones, c.n)
			})
			hs := hosts(t, f.provider(t, nil))
			if len(hs) != c.n {
				t.Fatalf("%d hosts; want %d", len(hs), c.n)
			}
			if n := f.calls(""); n != c.want {
				t.Errorf("%d requests for %d instances; want %d", n, c.n, c.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	good := gcp.Config{Project: "test-project", Zone: "us-central1-a", MIG: "gpu-mig"}
	if err := good.Validate(); err != nil {
		t.Fatalf("a good config: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(*gcp.Config)
		flag string
	}{
		{"no project", func(c *gcp.Config) { c.Project = "" }, "--project is required"},
		{"bad project", func(c *gcp.Config) { c.Project = "Test Project" }, "--project"},
		{"no mig", func(c *gcp.Config) { c.MIG = "" }, "--mig is required"},
		{"bad mig", func(c *gcp.Config) { c.MIG = "gpu/mig" }, "--mig"},
		{"no location", func(c *gcp.Config) { c.Zone = "" }, "--zone or --region is required"},
		{"both locations", func(c *gcp.Config) { c.Region = "us-central1" }, "give one"},
		{"bad zone", func(c *gcp.Config) { c.Zone = "us central1" }, "--zone"},
		{"bad region", func(c *gcp.Config) { c.Zone = ""; c.Region = "US" }, "--region"},
		{"negative slots", func(c *gcp.Config) { c.SlotsPerHost = -1 }, "--slots-per-host"},
		{"too many slots", func(c *gcp.Config) { c.SlotsPerHost = providers.MaxSlots + 1 }, "--slots-per-host"},
		{"bad endpoint", func(c *gcp.Config) { c.Endpoint = "compute.googleapis.com" }, "--endpoint"},
		{"endpoint with a query", func(c *gcp.Config) { c.Endpoint = "https://x.example/?a=b" }, "--endpoint"},
		{"negative interval", func(c *gcp.Config) { c.MinInterval = -time.Second }, "interval"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.edit(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), c.flag) {
				t.Fatalf("Validate: %v; want an error naming %q", err, c.flag)
			}
			if _, nerr := gcp.New(cfg); nerr == nil || nerr.Error() != err.Error() {
				t.Errorf("New: %v; want the Validate error", nerr)
			}
		})
	}
	for _, p := range []string{"my-project-123", "example.com:my-project"} {
		cfg := good
		cfg.Project = p
		if err := cfg.Validate(); err != nil {
			t.Errorf("project %q: %v", p, err)
		}
	}
}

func BenchmarkHosts10k(b *testing.B) {
	f := newFake(b, "")
	f.change(func(f *fakeCompute) {
		f.paginated = true
		f.managed, f.instances = bigGroup(testProject, []string{testZone}, 10_000)
	})
	cfg := f.config()
	cfg.Logger = nil
	p, err := gcp.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := b.Context()
	if hs, err := p.Hosts(ctx); err != nil || len(hs) != 10_000 { // warm: client, connections, the fake's page cache
		b.Fatalf("Hosts: %d hosts, %v", len(hs), err)
	}
	before := f.calls("")
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := p.Hosts(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(f.calls("")-before)/float64(b.N), "calls/poll")
}

func TestDefaultCredentialsReachTheAPI(t *testing.T) {
	// The default chain with a service-account key: the requests the provider makes carry the
	// bearer token that the credentials give, through the provider's own HTTP client.
	f := newFake(t, "zonal")
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := json.Marshal(map[string]string{
		"type": "service_account", "project_id": testProject, "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "elasticd@test-project.iam.gserviceaccount.com", "client_id": "1",
		"token_uri": f.srv.URL + "/token",
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "key.json")
	if err := os.WriteFile(path, sa, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", path)
	var auth []string // under f.mu
	f.change(func(f *fakeCompute) {
		f.onRequest = func(r *http.Request) { auth = append(auth, r.Header.Get("Authorization")) }
	})
	sameHosts(t, "with a service-account key", hosts(t, f.provider(t, func(c *gcp.Config) { c.ClientOptions = nil })), zonalWant)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(auth) != 2 {
		t.Fatalf("%d API requests; want 2", len(auth))
	}
	for _, a := range auth {
		if !strings.HasPrefix(a, "Bearer ") || len(a) < 20 {
			t.Errorf("Authorization %q; want the credentials' bearer token", a)
		}
	}
	if f.tokens != 1 {
		t.Errorf("the token endpoint was asked %d times; want once (the token is reused)", f.tokens)
	}
}
