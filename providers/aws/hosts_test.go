package aws_test

import (
	"cmp"
	"context"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/aws"
)

// sameHosts compares hosts as sets keyed by ID, every field and Leaving included.
func sameHosts(t *testing.T, what string, got, want []providers.Host) {
	t.Helper()
	byID := func(a, b providers.Host) int { return cmp.Compare(a.ID, b.ID) }
	got, want = slices.SortedFunc(slices.Values(got), byID), slices.SortedFunc(slices.Values(want), byID)
	eq := func(a, b providers.Host) bool { return providers.SameHost(a, b) && a.Leaving == b.Leaving }
	if !slices.EqualFunc(got, want, eq) {
		t.Errorf("%s:\n got  %+v\n want %+v", what, got, want)
	}
}

func mustHosts(t *testing.T, p *aws.Provider) []providers.Host {
	t.Helper()
	hosts, err := p.Hosts(pollCtx(t))
	if err != nil {
		t.Fatalf("Hosts: %v", err)
	}
	return hosts
}

// TestWhoIsAHost: the group's lifecycle states and EC2's instance states decide which
// instances are hosts, which are leaving and which are not listed.
func TestWhoIsAHost(t *testing.T) {
	var all []*fakeInst
	mk := func(lifecycle, state string, edit func(*fakeInst)) *fakeInst {
		i := inst(len(all) + 1)
		i.Lifecycle, i.State = lifecycle, state
		if edit != nil {
			edit(i)
		}
		all = append(all, i)
		return i
	}
	spot := mk("InService", "running", func(i *fakeInst) { i.Spot, i.Type = true, "p5.48xlarge" })
	onDemand := mk("InService", "running", func(i *fakeInst) { i.Type = "g5.xlarge" })
	cpu := mk("InService", "running", func(i *fakeInst) { i.Type = "c7i.4xlarge" })
	termWait := mk("Terminating:Wait", "running", nil)
	terminating := mk("Terminating", "shutting-down", nil)
	detaching := mk("Detaching", "running", nil)
	stopping := mk("InService", "stopping", nil) // EC2 takes it before the group notices
	mk("Pending", "pending", func(i *fakeInst) { i.IP = "" })
	mk("Pending:Wait", "running", nil)
	mk("InService", "running", func(i *fakeInst) { i.IP = "" }) // no private IP yet
	mk("InService", "running", func(i *fakeInst) { i.Hidden = true })
	mk("Terminated", "terminated", nil)
	mk("InService", "stopped", nil)
	mk("Standby", "running", nil)
	mk("Terminating:Proceed", "terminated", nil)

	f := newFake(t, all...)
	p := newProvider(t, f, aws.Config{})
	leaving := func(i *fakeInst) providers.Host {
		h := i.host(8)
		h.Leaving = true
		return h
	}
	sameHosts(t, "hosts", mustHosts(t, p), []providers.Host{
		spot.host(8), onDemand.host(1), cpu.host(1),
		leaving(termWait), leaving(terminating), leaving(detaching), leaving(stopping),
	})

	// A group being deleted: every host is leaving.
	f.change(func() { f.status = "Delete in progress" })
	for _, h := range mustHosts(t, p) {
		if !h.Leaving {
			t.Errorf("group being deleted: host %s is not leaving", h.ID)
		}
	}
	// Scaled in to nothing: the group still lists instances EC2 has terminated. An empty
	// group, not an error.
	f.change(func() {
		for _, i := range f.insts {
			i.Lifecycle, i.State = "Terminating:Proceed", "terminated"
		}
	})
	if hosts := mustHosts(t, p); len(hosts) != 0 {
		t.Errorf("all terminated: %v", hosts)
	}
}

func TestSlots(t *testing.T) {
	types := []struct {
		typ   string
		slots int
	}{
		{"p5.48xlarge", 8}, {"p4d.24xlarge", 8}, {"p3.8xlarge", 4}, {"g6e.12xlarge", 4},
		{"g5.xlarge", 1}, {"g4dn.metal", 8}, {"p2.16xlarge", 16}, {"m7i.large", 1}, {"", 1},
	}
	var insts []*fakeInst
	for i, c := range types {
		in := inst(i + 1)
		in.Type = c.typ
		insts = append(insts, in)
	}
	f := newFake(t, insts...)
	for _, override := range []int{0, 2} {
		t.Run(fmt.Sprintf("slots-per-host=%d", override), func(t *testing.T) {
			hosts := mustHosts(t, newProvider(t, f, aws.Config{SlotsPerHost: override}))
			if len(hosts) != len(types) {
				t.Fatalf("%d hosts, want %d", len(hosts), len(types))
			}
			for i, h := range hosts {
				want := types[i].slots
				if override > 0 {
					want = override
				}
				if h.Slots != want || h.Type != types[i].typ {
					t.Errorf("%s (%q): %d slots; want %d", h.ID, h.Type, h.Slots, want)
				}
			}
		})
	}
	if got := aws.GPUTable()["p4d.24xlarge"]; got != 8 {
		t.Errorf("GPUTable()[p4d.24xlarge] = %d", got)
	}
}

// TestPages: the group on the second page of DescribeAutoScalingGroups, its instances over
// three pages of DescribeInstances (the largest page is 1000), all of them listed.
func TestPages(t *testing.T) {
	t.Parallel()
	var insts []*fakeInst
	want := []providers.Host{}
	for i := range 2500 {
		in := inst(i + 1)
		insts = append(insts, in)
		want = append(want, in.host(8))
	}
	f := newFake(t, insts...)
	f.change(func() { f.emptyPage = true })
	p := newProvider(t, f, aws.Config{})
	sameHosts(t, "hosts", mustHosts(t, p), want)
	if n := f.count("DescribeAutoScalingGroups"); n != 2 {
		t.Errorf("DescribeAutoScalingGroups called %d times; want 2 (an empty page, then the group)", n)
	}
	if n := f.count("DescribeInstances"); n != 3 {
		t.Errorf("DescribeInstances called %d times; want 3 pages of at most 1000", n)
	}
	for _, in := range f.inputs["DescribeInstances"] {
		if in.Get("MaxResults") != "1000" {
			t.Errorf("DescribeInstances MaxResults=%q; want the largest page, 1000", in.Get("MaxResults"))
		}
		if in.Has("InstanceId.1") {
			t.Error("DescribeInstances with instance IDs cannot page; the group's tag selects them")
		}
	}
}

// TestCallsGrowWithPages: the API calls of one poll are one for the group plus one per page
// of 1000 instances, whatever the number of instances in a page.
func TestCallsGrowWithPages(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	p := newProvider(t, f, aws.Config{})
	sizes := []int{1, 999, 1000, 1001, 2500, 10000}
	if raceDetector {
		sizes = sizes[:len(sizes)-1]
	}
	for _, n := range sizes {
		f.change(func() {
			f.insts = f.insts[:0]
			for i := range n {
				f.insts = append(f.insts, inst(i+1))
			}
		})
		f.resetCounts()
		if hosts := mustHosts(t, p); len(hosts) != n {
			t.Fatalf("%d instances: %d hosts", n, len(hosts))
		}
		calls := f.count("DescribeAutoScalingGroups") + f.count("DescribeInstances")
		if want := 1 + (n+999)/1000; calls != want {
			t.Errorf("%d instances: %d calls; want %d (1 + one per 1000)", n, calls, want)
		}
		t.Logf("%5d instances: %d calls", n, calls)
	}
	// An empty group needs no DescribeInstances at all.
	f.change(func() { f.insts = nil })
	f.resetCounts()
	if hosts := mustHosts(t, p); len(hosts) != 0 {
		t.Errorf("empty group: %v", hosts)
	}
	if n := f.count("DescribeInstances"); n != 0 {
		t.Errorf("empty group: DescribeInstances called %d times", n)
	}
}

// TestMinInterval: polls sooner than MinInterval after a successful one call nothing; the
// first after it calls again; concurrent polls make one round of calls.
func TestMinInterval(t *testing.T) {
	f := newFake(t, inst(1), inst(2))
	const every = 400 * time.Millisecond
	p := newProvider(t, f, aws.Config{MinInterval: every})
	start := time.Now()
	first := mustHosts(t, p)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if hosts, err := p.Hosts(pollCtx(t)); err != nil || len(hosts) != 2 {
				t.Errorf("concurrent poll: %v, %v", hosts, err)
			}
		})
	}
	wg.Wait()
	for range 20 {
		sameHosts(t, "cached poll", mustHosts(t, p), first)
	}
	if time.Since(start) >= every {
		t.Skip("the machine is too slow for this test's timing")
	}
	if a, e := f.count("DescribeAutoScalingGroups"), f.count("DescribeInstances"); a != 1 || e != 1 {
		t.Errorf("29 polls within MinInterval: %d + %d calls; want 1 + 1", a, e)
	}
	time.Sleep(every - time.Since(start) + 10*time.Millisecond)
	f.change(func() { f.insts = f.insts[:1] })
	if hosts := mustHosts(t, p); len(hosts) != 1 {
		t.Errorf("after MinInterval: %d hosts; want the new group of 1", len(hosts))
	}
	if a := f.count("DescribeAutoScalingGroups"); a != 2 {
		t.Errorf("after MinInterval: %d calls; want 2", a)
	}
}

// TestEndpointOverride: every call goes to Config.Endpoint, signed for Config.Region and its
// own service.
func TestEndpointOverride(t *testing.T) {
	t.Parallel()
	f := newFake(t, inst(1))
	p := newProvider(t, f, aws.Config{Region: "eu-west-3", SQSQueueURL: f.queueURL})
	mustHosts(t, p)
	if _, err := p.Notices(pollCtx(t)); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for op, want := range map[string]string{
		"DescribeAutoScalingGroups": "eu-west-3/autoscaling",
		"DescribeInstances":         "eu-west-3/ec2",
		"ReceiveMessage":            "eu-west-3/sqs",
	} {
		if got := f.signed[op]; len(got) != 1 || got[0] != want {
			t.Errorf("%s reached the fake signed for %v; want once, for %s", op, got, want)
		}
	}
}

// TestRegionFromEnvironment: without --region the SDK's own (AWS_REGION) is used; with none
// at all the first poll says --region is required.
func TestRegionFromEnvironment(t *testing.T) {
	f := newFake(t, inst(1))
	t.Setenv("AWS_REGION", "ap-south-1")
	p, err := aws.New(aws.Config{ASG: fakeGroup, Endpoint: f.srv.URL, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mustHosts(t, p)
	if got := f.signed["DescribeAutoScalingGroups"]; len(got) != 1 || got[0] != "ap-south-1/autoscaling" {
		t.Errorf("signed for %v; want ap-south-1/autoscaling", got)
	}

	t.Setenv("AWS_REGION", "")
	p, err = aws.New(aws.Config{ASG: fakeGroup, Endpoint: f.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Hosts(pollCtx(t))
	if err == nil || !containsAll(err.Error(), "--region is required", fakeGroup) {
		t.Errorf("no region anywhere: %v; want it to say --region is required and name the group", err)
	}
}

// TestContextEndsWhileWaiting: a poll waiting its turn behind a stalled one gives up with
// its own context.
func TestContextEndsWhileWaiting(t *testing.T) {
	f := newFake(t, inst(1))
	p := newProvider(t, f, aws.Config{})
	f.mu.Lock()
	f.stall = true
	f.mu.Unlock()
	stalled, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Hosts(stalled)
	}()
	time.Sleep(50 * time.Millisecond)
	ctx, cancel2 := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel2()
	start := time.Now()
	if _, err := p.Hosts(ctx); err == nil || time.Since(start) > time.Second {
		t.Errorf("waiting poll: %v after %v; want its deadline's error at once", err, time.Since(start))
	}
	cancel()
	<-done
}

// TestCustomCABundle: over HTTPS with a private CA given the SDK's way (AWS_CA_BUNDLE), as
// behind a TLS-inspecting proxy or with a private endpoint.
func TestCustomCABundle(t *testing.T) {
	f := newFakeTLS(t, inst(1))
	bundle := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	if err := os.WriteFile(bundle, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_CA_BUNDLE", bundle)
	if hosts := mustHosts(t, newProvider(t, f, aws.Config{})); len(hosts) != 1 {
		t.Errorf("hosts %v; want the one", hosts)
	}

	t.Setenv("AWS_CA_BUNDLE", "")
	start := time.Now()
	_, err := newProvider(t, f, aws.Config{}).Hosts(pollCtx(t))
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("without the bundle: %v; want a certificate error", err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("a certificate error took %v: it must not be retried", took)
	}
}
