package ibm_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/ibm"
)

// poll polls once with a bounded context: a guard against a hang, not a speed test (a
// 10,000-instance group under -race took over 20 s on a busy 2-core runner).
func poll(t *testing.T, p *ibm.Provider) ([]providers.Host, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	return p.Hosts(ctx)
}

func mustPoll(t *testing.T, p *ibm.Provider) []providers.Host {
	t.Helper()
	hosts, err := poll(t, p)
	if err != nil {
		t.Fatalf("Hosts: %v", err)
	}
	return hosts
}

// sameHosts compares as sets by ID, every field, Leaving included.
func sameHosts(t *testing.T, got, want []providers.Host) {
	t.Helper()
	byID := func(a, b providers.Host) int { return cmp.Compare(a.ID, b.ID) }
	g, w := slices.SortedFunc(slices.Values(got), byID), slices.SortedFunc(slices.Values(want), byID)
	same := func(a, b providers.Host) bool { return providers.SameHost(a, b) && a.Leaving == b.Leaving }
	if !slices.EqualFunc(g, w, same) {
		t.Errorf("hosts:\n got  %+v\n want %+v", g, w)
	}
}

// wantError fails the test unless err is non-nil and mentions every part.
func wantError(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one mentioning %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
	t.Logf("the error reads: %v", err)
}

// TestHostStates checks which instances are listed and how: one instance of each state.
func TestHostStates(t *testing.T) {
	base := instances(1)[0]
	mk := func(id string, change func(in *fakeInstance)) fakeInstance {
		in := base
		in.ID, in.Name = "0717_"+id, id
		change(&in)
		return in
	}
	leaving := func(in fakeInstance, slots int) providers.Host {
		h := hostOf(in, slots)
		h.Leaving = true
		return h
	}
	var (
		spotL40S    = mk("spot-l40s", func(in *fakeInstance) { in.Profile, in.Class, in.IP = "gx3-48x240x2l40s", "spot", "10.240.0.10" })
		standard    = mk("standard-nic", func(in *fakeInstance) { in.Class, in.Attachment, in.IP = "standard", false, "10.240.0.11" })
		pendingNoIP = mk("pending", func(in *fakeInstance) {
			in.Status, in.Lifecycle, in.IP, in.Membership = "pending", "pending", "0.0.0.0", "pending"
		})
		noIPYet   = mk("running-no-ip", func(in *fakeInstance) { in.IP = "0.0.0.0" })
		starting  = mk("starting", func(in *fakeInstance) { in.Status, in.IP = "starting", "10.240.0.12" })
		preempted = mk("preempted", func(in *fakeInstance) {
			in.Status, in.Reason, in.IP = "stopped", "stopped_by_preemption", "10.240.0.13"
		})
		stopping = mk("stopping", func(in *fakeInstance) { in.Status, in.IP = "stopping", "10.240.0.14" })
		deleting = mk("deleting", func(in *fakeInstance) {
			in.Status, in.Lifecycle, in.IP, in.Membership = "deleting", "deleting", "10.240.0.15", "deleting"
		})
		scaledIn     = mk("membership-deleting", func(in *fakeInstance) { in.IP, in.Membership = "10.240.0.16", "deleting" })
		failed       = mk("failed", func(in *fakeInstance) { in.Status, in.Lifecycle, in.IP = "failed", "failed", "10.240.0.17" })
		restarting   = mk("restarting", func(in *fakeInstance) { in.Status, in.IP = "restarting", "10.240.0.18" })
		newProfile   = mk("new-profile", func(in *fakeInstance) { in.Profile, in.GPUs, in.IP = "gx4-64x512x4b200", 4, "10.240.0.19" })
		cpuOnly      = mk("cpu-only", func(in *fakeInstance) { in.Profile, in.IP = "bx2-8x32", "10.240.0.20" })
		unhealthy    = mk("unhealthy", func(in *fakeInstance) { in.IP, in.Membership = "10.240.0.21", "unhealthy" })
		startingGone = mk("starting-removed", func(in *fakeInstance) { in.Status, in.IP, in.Membership = "starting", "10.240.0.22", "deleting" })
		suspended    = mk("suspended", func(in *fakeInstance) { in.Lifecycle, in.IP = "suspended", "10.240.0.23" })
	)
	f := newFake(t, spotL40S, standard, pendingNoIP, noIPYet, starting, preempted, stopping, deleting,
		scaledIn, failed, restarting, newProfile, cpuOnly, unhealthy, startingGone, suspended)
	got := mustPoll(t, f.provider(t, ibm.Config{}))
	sameHosts(t, got, []providers.Host{
		hostOf(spotL40S, 2),
		hostOf(standard, 1),
		// pending (no IP), running without an IP yet, starting (even when its membership is
		// being deleted): not listed
		leaving(preempted, 1),
		leaving(stopping, 1),
		leaving(deleting, 1),
		leaving(scaledIn, 1),
		leaving(failed, 1),
		leaving(restarting, 1),
		hostOf(newProfile, 4), // not in the table: the API's gpu.count
		hostOf(cpuOnly, 1),
		hostOf(unhealthy, 1),  // an unhealthy membership is the job's to judge, not a removal
		leaving(suspended, 1), // running, but its lifecycle says the cloud suspended it
	})
}

// TestJoinIgnoresOtherGroups: if the API returned instances of other groups (a filter it did
// not apply), the provider still lists only the group's members.
func TestJoinIgnoresOtherGroups(t *testing.T) {
	ins := instances(4)
	ins[1].Group, ins[1].Membership = "r006-ig-other", "healthy"
	ins[2].Group, ins[2].Membership = "", ""
	f := newFake(t, ins...)
	f.update(func(f *fakeVPC) { f.ignoreFilter = true })
	sameHosts(t, mustPoll(t, f.provider(t, ibm.Config{})), hostsOf([]fakeInstance{ins[0], ins[3]}))
}

func TestSlots(t *testing.T) {
	ins := instances(4) // one of each profile in the fake: l40s×1, l40s×2, h100×8, v100×2
	for _, c := range []struct {
		name     string
		override int
		want     []int
	}{
		{"GPUTable", 0, []int{1, 2, 8, 2}},
		{"SlotsPerHost", 3, []int{3, 3, 3, 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, ins...)
			got := mustPoll(t, f.provider(t, ibm.Config{SlotsPerHost: c.override}))
			var want []providers.Host
			for i, in := range ins {
				want = append(want, hostOf(in, c.want[i]))
			}
			sameHosts(t, got, want)
		})
	}
}

// TestPages: listings of several pages, at the API's page size and at a smaller one the
// server chose, give every member once; each page is one request, with limit=100.
func TestPages(t *testing.T) {
	t.Parallel()
	ins := instances(250)
	for _, pageMax := range []int{apiMaxPage, 7} {
		t.Run(fmt.Sprintf("server pages of %d", pageMax), func(t *testing.T) {
			f := newFake(t, ins...)
			f.update(func(f *fakeVPC) { f.pageMax = pageMax })
			sameHosts(t, mustPoll(t, f.provider(t, ibm.Config{})), hostsOf(ins))
			pages := (len(ins) + pageMax - 1) / pageMax
			if m, i := f.count(epMemberships), f.count(epInstances); m != pages || i != pages {
				t.Errorf("memberships %d requests, instances %d; want %d each (one per page)", m, i, pages)
			}
			for _, r := range f.requests("") {
				if q, _ := url.ParseQuery(r.query); q.Get("limit") != "100" {
					t.Errorf("request %s?%s: want limit=100, the API's largest page", r.path, r.query)
				}
			}
		})
	}
}

// TestCallsGrowWithPages: the requests of a poll grow with the pages of the group, not with
// its instances: no request is made per member.
func TestCallsGrowWithPages(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 100, 101, 1000, 10000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			f := newFake(t, instances(n)...)
			f.update(func(f *fakeVPC) { f.lean = true })
			p := f.provider(t, ibm.Config{})
			hosts := mustPoll(t, p)
			if len(hosts) != n {
				t.Fatalf("%d hosts; want %d", len(hosts), n)
			}
			pages := (n + apiMaxPage - 1) / apiMaxPage
			if got, want := f.total(), 1+2*pages; got != want {
				t.Errorf("first poll: %d requests; want %d (the group lookup, then %d pages of memberships and of instances)", got, want, pages)
			}
			if n <= 1000 { // the next poll is the first without the lookup; spared at 10,000 for -race's sake
				before := f.total()
				mustPoll(t, p)
				if got, want := f.total()-before, 2*pages; got != want {
					t.Errorf("next poll: %d requests; want %d", got, want)
				}
			}
			t.Logf("%d instances: %d requests a poll", n, 2*pages)
		})
	}
}

// TestMinInterval: polls within MinInterval of the last one reach the API no more; they get
// fresh copies of its hosts, or its error.
func TestMinInterval(t *testing.T) {
	t.Parallel()
	ins := instances(3)
	f := newFake(t, ins...)
	const interval = time.Second // long enough that a loaded machine does not outlast it
	p := f.provider(t, ibm.Config{MinInterval: interval})
	start := time.Now()
	first := mustPoll(t, p)
	calls := f.total()
	first[0].Addr = "changed by the caller"
	for range 5 {
		sameHosts(t, mustPoll(t, p), hostsOf(ins))
	}
	if time.Since(start) < interval {
		if got := f.total(); got != calls {
			t.Fatalf("%d requests after 6 polls within MinInterval; want %d, the first poll's", got, calls)
		}
	}
	time.Sleep(time.Until(start.Add(interval)))
	mustPoll(t, p)
	if got := f.total(); got <= calls {
		t.Fatalf("no request after MinInterval passed")
	}

	// A failed poll is kept as long: the API is not asked again at once.
	f.stick(epMemberships, &reply{status: http.StatusForbidden, file: "error_forbidden.json"})
	time.Sleep(interval)
	failedAt := time.Now()
	_, err1 := poll(t, p)
	calls = f.total()
	_, err2 := poll(t, p)
	if err1 == nil || err2 == nil || err1.Error() != err2.Error() {
		t.Fatalf("errors %v and %v; want the same error twice", err1, err2)
	}
	if f.total() != calls && time.Since(failedAt) < interval {
		t.Errorf("the poll after a failure within MinInterval made %d requests; want none", f.total()-calls)
	}
}

// TestConcurrentPollsShareOne: polls that overlap make one set of requests.
func TestConcurrentPollsShareOne(t *testing.T) {
	ins := instances(3)
	f := newFake(t, ins...)
	p := f.provider(t, ibm.Config{MinInterval: time.Minute})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			if _, err := p.Hosts(ctx); err != nil {
				t.Errorf("Hosts: %v", err)
			}
		})
	}
	wg.Wait()
	if got := f.total(); got != 3 {
		t.Errorf("8 concurrent polls made %d requests; want 3 (one poll)", got)
	}
}

// TestMalformed: replies that are not what the API promises give a clear error, no panic and
// no hosts.
func TestMalformed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		endpoint, file, contentType string
		want                        []string
	}{
		{epInstances, "malformed/truncated.json", "", []string{"list the group's instances", "malformed reply"}},
		{epInstances, "malformed/instances_not_array.json", "", []string{"malformed reply"}},
		{epInstances, "malformed/no_instances.json", "", []string{"no instances array"}},
		{epInstances, "malformed/instance_without_id.json", "", []string{"an instance has no id"}},
		{epInstances, "malformed/instance_without_zone.json", "", []string{"0717_i-1", "no zone.name"}},
		{epInstances, "malformed/instance_without_status.json", "", []string{"0717_i-1", "no status"}},
		{epInstances, "malformed/bad_ip.json", "", []string{"0717_i-1", `"10.240.0.300" is not an IP address`}},
		{epInstances, "malformed/bad_created_at.json", "", []string{"malformed reply"}},
		{epInstances, "malformed/status_not_string.json", "", []string{"malformed reply"}},
		{epInstances, "malformed/next_loop.json", "", []string{"r006-loop", "again"}},
		{epInstances, "malformed/proxy_error.html", "text/html", []string{"malformed reply"}},
		{epInstances, "", "", []string{"no instances array"}}, // 200 with an empty body
		{epMemberships, "malformed/membership_without_instance.json", "", []string{"membership 0", "no instance.id"}},
		{epMemberships, "malformed/truncated.json", "", []string{"list the group's memberships", "malformed reply"}},
	} {
		t.Run(c.endpoint+"/"+cmp.Or(c.file, "empty"), func(t *testing.T) {
			f := newFake(t, instances(2)...)
			f.stick(c.endpoint, &reply{file: c.file, contentType: c.contentType})
			hosts, err := poll(t, f.provider(t, ibm.Config{}))
			wantError(t, err, append([]string{groupName, "us-south"}, c.want...)...)
			if hosts != nil {
				t.Errorf("hosts %v with the error", hosts)
			}
		})
	}
}

// TestThrottleRetryAfter: a 429 with Retry-After is waited out, for that endpoint, and the
// same poll goes on: the other endpoint's request is not repeated.
func TestThrottleRetryAfter(t *testing.T) {
	t.Parallel()
	ins := instances(3)
	f := newFake(t, ins...)
	f.queue(epInstances, reply{status: http.StatusTooManyRequests, retryAfter: "1", file: "error_throttled.json"})
	p := f.provider(t, ibm.Config{MaxBackoff: 5 * time.Second})
	sameHosts(t, mustPoll(t, p), hostsOf(ins))
	reqs := f.requests(epInstances)
	if len(reqs) != 2 {
		t.Fatalf("%d instances requests; want 2 (the throttled one, then its retry)", len(reqs))
	}
	if gap := reqs[1].at.Sub(reqs[0].at); gap < time.Second {
		t.Errorf("retried %v after the 429; Retry-After asked for 1s", gap)
	}
	if n := f.count(epMemberships); n != 1 {
		t.Errorf("%d memberships requests; want 1: only the throttled request is retried", n)
	}
}

// TestThrottlePerEndpoint: while an endpoint backs off past a poll's deadline, polls fail at
// once with ErrThrottled and ask the API nothing; once the wait fits, the poll waits for
// that endpoint only, and recovers.
func TestThrottlePerEndpoint(t *testing.T) {
	t.Parallel()
	ins := instances(3)
	f := newFake(t, ins...)
	p := f.provider(t, ibm.Config{MaxBackoff: 10 * time.Second})
	mustPoll(t, p) // the group is found; polls from here make 2 requests

	f.stick(epInstances, &reply{status: http.StatusTooManyRequests, retryAfter: "2", file: "error_throttled.json"})
	// A poll that waited would end with its context's deadline, not ErrThrottled.
	short := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		_, err := p.Hosts(ctx)
		return err
	}
	err := short()
	if !errors.Is(err, ibm.ErrThrottled) {
		t.Fatalf("throttled poll: %v; want ErrThrottled", err)
	}
	wantError(t, err, groupName, "us-south", "list the group's instances", "429")
	throttledAt := f.requests(epInstances)[1].at
	calls := f.total()
	if err := short(); !errors.Is(err, ibm.ErrThrottled) {
		t.Fatalf("poll while backing off: %v; want ErrThrottled", err)
	}
	if f.total() != calls {
		t.Errorf("a poll that cannot wait out the backoff made %d requests; want none", f.total()-calls)
	}

	f.stick(epInstances, nil)
	sameHosts(t, mustPoll(t, p), hostsOf(ins))
	m, i := f.requests(epMemberships), f.requests(epInstances)
	lastM, lastI := m[len(m)-1].at, i[len(i)-1].at
	if lastI.Sub(throttledAt) < 2*time.Second {
		t.Errorf("instances asked again %v after the 429; Retry-After said 2s", lastI.Sub(throttledAt))
	}
	if lastM.Sub(throttledAt) >= 2*time.Second-100*time.Millisecond {
		t.Errorf("memberships asked %v after the instances' 429: its endpoint waited for the other's backoff", lastM.Sub(throttledAt))
	}
}

// TestThrottleBounded: a Retry-After of an hour is capped at MaxBackoff; a 429 without one
// backs off; a poll tries a throttled page at most 3 times.
func TestThrottleBounded(t *testing.T) {
	t.Parallel()
	ins := instances(2)
	t.Run("LongRetryAfter", func(t *testing.T) {
		f := newFake(t, ins...)
		f.queue(epInstances, reply{status: http.StatusTooManyRequests, retryAfter: "3600"},
			reply{status: http.StatusServiceUnavailable, retryAfter: time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)})
		start := time.Now()
		sameHosts(t, mustPoll(t, f.provider(t, ibm.Config{MaxBackoff: 100 * time.Millisecond})), hostsOf(ins))
		if took := time.Since(start); took < 200*time.Millisecond || took > 5*time.Second {
			t.Errorf("poll took %v; want two waits of MaxBackoff (100ms)", took)
		}
	})
	t.Run("GivesUp", func(t *testing.T) {
		f := newFake(t, ins...)
		f.stick(epInstances, &reply{status: http.StatusTooManyRequests, file: "error_throttled.json"})
		_, err := poll(t, f.provider(t, ibm.Config{MaxBackoff: 20 * time.Millisecond}))
		if !errors.Is(err, ibm.ErrThrottled) {
			t.Fatalf("err %v; want ErrThrottled", err)
		}
		wantError(t, err, "3 times", "Rate limit exceeded")
		if n := f.count(epInstances); n != 3 {
			t.Errorf("%d requests of the throttled page; want 3", n)
		}
	})
}

// TestServerErrorBacksOff: a 5xx fails the poll at once (the watcher retries polls), and the
// endpoint is not asked again before its backoff has passed.
func TestServerErrorBacksOff(t *testing.T) {
	t.Parallel()
	ins := instances(2)
	f := newFake(t, ins...)
	p := f.provider(t, ibm.Config{MaxBackoff: 200 * time.Millisecond})
	f.queue(epMemberships, reply{status: http.StatusInternalServerError, file: "error_internal.json"})
	_, err := poll(t, p)
	wantError(t, err, groupName, "HTTP 500", "Internal error")
	if n := f.count(epMemberships); n != 1 {
		t.Errorf("%d memberships requests; want 1: a server error is not retried inside the poll", n)
	}
	sameHosts(t, mustPoll(t, p), hostsOf(ins))
	m := f.requests(epMemberships)
	if gap := m[1].at.Sub(m[0].at); gap < 200*time.Millisecond {
		t.Errorf("asked again %v after a 500; want the backoff (200ms) first", gap)
	}
}

// TestFirstPollErrors: a wrong group, a refused or unpermitted key, and no key at all each
// fail the first poll with an error that names the group and the region and says what to fix.
func TestFirstPollErrors(t *testing.T) {
	t.Parallel()
	t.Run("GroupNotFound", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		_, err := poll(t, f.provider(t, ibm.Config{InstanceGroup: "gpu-spto"}))
		wantError(t, err, `"gpu-spto"`, "region us-south", "not found among the 2 instance groups", "--instance-group", "--region")
	})
	t.Run("Unauthorized", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		f.stick(epGroups, &reply{status: http.StatusUnauthorized, file: "error_unauthorized.json"})
		_, err := poll(t, f.provider(t, ibm.Config{}))
		wantError(t, err, groupName, "region us-south", "HTTP 401", "API key")
	})
	t.Run("Forbidden", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		f.stick(epGroups, &reply{status: http.StatusForbidden, file: "error_forbidden.json"})
		_, err := poll(t, f.provider(t, ibm.Config{}))
		wantError(t, err, groupName, "region us-south", "HTTP 403", "Viewer role")
	})
	t.Run("GroupDeletedLater", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		p := f.provider(t, ibm.Config{})
		mustPoll(t, p)
		f.update(func(f *fakeVPC) { f.groups = f.groups[:1] })
		_, err := poll(t, p)
		wantError(t, err, groupName, "no longer exists", "HTTP 404")
		_, err = poll(t, p) // looked up again by name
		wantError(t, err, "not found among the 1 instance groups")
	})
}

// TestGroupByIDOrName: --instance-group takes an ID or a unique name.
func TestGroupByIDOrName(t *testing.T) {
	ins := instances(2)
	f := newFake(t, ins...)
	f.update(func(f *fakeVPC) {
		f.groups = append(f.groups, fakeGroup{"r006-ig-twin-1", "twin"}, fakeGroup{"r006-ig-twin-2", "twin"})
	})
	sameHosts(t, mustPoll(t, f.provider(t, ibm.Config{InstanceGroup: groupID})), hostsOf(ins))
	sameHosts(t, mustPoll(t, f.provider(t, ibm.Config{InstanceGroup: groupName})), hostsOf(ins))
	_, err := poll(t, f.provider(t, ibm.Config{InstanceGroup: "twin"}))
	wantError(t, err, "2 instance groups have this name", "r006-ig-twin-1", "r006-ig-twin-2", "give --instance-group the ID")
}

// clearCredentials removes every credential source the SDK would read, for this test.
func clearCredentials(t *testing.T) {
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "VPC_") || strings.HasPrefix(k, "IBMCLOUD_") || k == "IC_API_KEY" || k == "VCAP_SERVICES" {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	t.Setenv("IBM_CREDENTIALS_FILE", "/nonexistent/ibm-credentials.env")
	t.Setenv("HOME", t.TempDir())
}

func TestCredentials(t *testing.T) {
	t.Run("Missing", func(t *testing.T) {
		clearCredentials(t)
		t.Setenv("VPC_ID", "r006-unrelated") // a VPC_* variable that is not a credential
		f := newFake(t, instances(2)...)
		p, err := ibm.New(ibm.Config{InstanceGroup: groupName, Region: "eu-de", Endpoint: f.base})
		if err != nil {
			t.Fatalf("New: %v (missing credentials are reported by the poll)", err)
		}
		_, err = poll(t, p)
		wantError(t, err, groupName, "region eu-de", "no IBM Cloud credentials", "IBMCLOUD_API_KEY")
		if n := f.total(); n != 0 {
			t.Errorf("%d requests without credentials", n)
		}
	})
	t.Run("BadAPIKey", func(t *testing.T) {
		clearCredentials(t)
		f := newFake(t, instances(2)...)
		iam := newIAM(t)
		t.Setenv("VPC_AUTH_TYPE", "iam")
		t.Setenv("VPC_APIKEY", "not-a-key")
		t.Setenv("VPC_AUTH_URL", iam.URL)
		p, err := ibm.New(ibm.Config{InstanceGroup: groupName, Region: "us-south", Endpoint: f.base})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		_, err = poll(t, p)
		wantError(t, err, groupName, "region us-south", "IAM token", "Provided API key could not be found", "check the API key")
		if n := f.total(); n != 0 {
			t.Errorf("%d API requests without a token", n)
		}
	})
	t.Run("APIKey", func(t *testing.T) {
		clearCredentials(t)
		f := newFake(t, instances(2)...)
		iam := newIAM(t)
		t.Setenv("VPC_AUTH_TYPE", "iam")
		t.Setenv("VPC_APIKEY", "good-key")
		t.Setenv("VPC_AUTH_URL", iam.URL)
		p, err := ibm.New(ibm.Config{InstanceGroup: groupName, Region: "us-south", Endpoint: f.base})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		sameHosts(t, mustPoll(t, p), hostsOf(instances(2)))
	})
}

// TestEndpoint: Config.Endpoint is where every request goes, its path prefix kept.
func TestEndpoint(t *testing.T) {
	f := newFake(t, instances(1)...)
	// Config.Endpoint = f.base, which ends in /v1 as the real API base does.
	mustPoll(t, f.provider(t, ibm.Config{Region: "jp-tok"}))
	for _, r := range f.requests("") {
		if !strings.HasPrefix(r.path, "/v1/") {
			t.Errorf("request to %s; want it under the endpoint's /v1", r.path)
		}
	}
	if f.total() != 3 {
		t.Errorf("%d requests at the endpoint; want 3", f.total())
	}
	// A trailing slash is tolerated.
	mustPoll(t, f.provider(t, ibm.Config{Endpoint: f.base + "/"}))
}

func TestValidate(t *testing.T) {
	ok := ibm.Config{InstanceGroup: "g", Region: "us-south"}
	for _, c := range []struct {
		name string
		edit func(c *ibm.Config)
		want string // "" valid
	}{
		{"Valid", func(c *ibm.Config) {}, ""},
		{"EndpointWithoutRegion", func(c *ibm.Config) { c.Region, c.Endpoint = "", "https://us-south.private.iaas.cloud.ibm.com/v1" }, ""},
		{"NoGroup", func(c *ibm.Config) { c.InstanceGroup = " " }, "--instance-group is required"},
		{"NoRegion", func(c *ibm.Config) { c.Region = "" }, "--region is required"},
		{"BadRegion", func(c *ibm.Config) { c.Region = "Dallas" }, "--region \"Dallas\""},
		{"BadEndpoint", func(c *ibm.Config) { c.Endpoint = "us-south.iaas.cloud.ibm.com" }, "--endpoint"},
		{"NegativeSlots", func(c *ibm.Config) { c.SlotsPerHost = -1 }, "--slots-per-host"},
		{"HugeSlots", func(c *ibm.Config) { c.SlotsPerHost = providers.MaxSlots + 1 }, "--slots-per-host"},
		{"NegativeMinInterval", func(c *ibm.Config) { c.MinInterval = -time.Second }, "MinInterval"},
		{"NegativeMaxBackoff", func(c *ibm.Config) { c.MaxBackoff = -time.Second }, "MaxBackoff"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.edit(&cfg)
			err := cfg.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			wantError(t, err, c.want)
			if _, nerr := ibm.New(cfg); nerr == nil {
				t.Errorf("New accepted a config that Validate refuses")
			}
		})
	}
}

// TestShiftedPages: an instance listed on two pages (the group changed between them) is one
// host.
func TestShiftedPages(t *testing.T) {
	f := newFake(t)
	f.queue(epInstances, reply{file: "pages/shifted_page1.json"}, reply{file: "pages/shifted_page2.json"})
	created := time.Date(2026, 10, 1, 8, 0, 0, 0, time.UTC)
	sameHosts(t, mustPoll(t, f.provider(t, ibm.Config{})), []providers.Host{
		{ID: "0717_dup", Addr: "10.240.0.4", Slots: 1, Zone: "us-south-1", Spot: true, Type: "gx3-24x120x1l40s", Launched: created},
		{ID: "0717_next", Addr: "10.240.0.5", Slots: 1, Zone: "us-south-2", Type: "gx3-24x120x1l40s", Launched: created.Add(time.Second)},
	})
}
