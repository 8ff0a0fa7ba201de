package azure_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/azure"
	"github.com/elasticd/elasticd/providers/providertest"
)

// gpuSlots is what the sizes used here must get from the provider's GPU table.
func gpuSlots(size string) int {
	n, ok := map[string]int{
		"Standard_ND96asr_v4":      8,
		"Standard_ND96isr_H100_v5": 8,
		"Standard_NC24ads_A100_v4": 1,
		"Standard_NC6s_v3":         1,
		"Standard_NC64as_T4_v3":    4,
		"Standard_NC48ads_A100_v4": 2,
	}[size]
	if !ok {
		return 1
	}
	return n
}

var t0 = time.Date(2026, 10, 2, 9, 0, 0, 0, time.UTC)

func vm(id, ip string) fakeVM {
	n, _ := strconv.Atoi(id)
	return fakeVM{ID: id, IP: ip, Zone: strconv.Itoa(n%3 + 1), Created: t0.Add(time.Duration(n) * time.Minute)}
}

func poll(t *testing.T, p providers.Provider) []providers.Host {
	t.Helper()
	// A guard against a hang, not a speed test: decoding 10,000 VMs under -race takes 7 s on
	// an idle machine and has taken over 20 s on a busy 2-core runner.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	hosts, err := p.Hosts(ctx)
	if err != nil {
		t.Fatalf("Hosts: %v", err)
	}
	return hosts
}

func pollErr(t *testing.T, p providers.Provider) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	hosts, err := p.Hosts(ctx)
	if err == nil {
		t.Fatalf("Hosts: no error, hosts %v", hosts)
	}
	if len(hosts) != 0 {
		t.Errorf("Hosts returned hosts %v with its error", hosts)
	}
	t.Logf("error: %v", err)
	return err
}

// sameHosts compares as sets keyed by ID, every field, Leaving included.
func sameHosts(t *testing.T, what string, got, want []providers.Host) {
	t.Helper()
	byID := func(a, b providers.Host) int { return cmp.Compare(a.ID, b.ID) }
	g, w := slices.SortedFunc(slices.Values(got), byID), slices.SortedFunc(slices.Values(want), byID)
	eq := func(a, b providers.Host) bool { return providers.SameHost(a, b) && a.Leaving == b.Leaving }
	if !slices.EqualFunc(g, w, eq) {
		t.Errorf("%s:\n got  %+v\n want %+v", what, g, w)
	}
}

func (f *fakeARM) wants(vms ...fakeVM) []providers.Host {
	var hs []providers.Host
	for _, v := range vms {
		hs = append(hs, f.want(v))
	}
	return hs
}

func TestConformance(t *testing.T) {
	providertest.Run(t, providertest.Harness{NewGroup: func(t *testing.T) providertest.Group {
		vms := []fakeVM{vm("0", "10.0.0.4"), vm("1", "10.0.0.5"), vm("3", "10.0.0.7")}
		vms[1].SKU = "Standard_NC24ads_A100_v4" // a VM not yet upgraded to the model's size
		f := newFake(t, vms...)
		return providertest.Group{
			Provider: f.provider(t),
			Want:     f.wants(vms...),
			Change: func(t *testing.T) []providers.Host {
				now := []fakeVM{vms[0], vms[2], vm("4", "10.0.0.8")}
				f.setVMs(now...)
				return f.wants(now...)
			},
			Fail: func(t *testing.T) {
				f.failEvery(reply{status: http.StatusForbidden, file: "error_authorization_failed.json"})
			},
			Stall: func(t *testing.T) { f.stallEvery() },
		}
	}})
}

func TestHostFields(t *testing.T) {
	f := newFake(t)
	v := fakeVM{ID: "12", IP: "10.0.1.12", Zone: "2", SKU: "Standard_ND96isr_H100_v5", Created: t0}
	f.setVMs(v, fakeVM{ID: "13", IP: "10.0.1.13", Created: t0}) // no zone: a regional set
	got := poll(t, f.provider(t))
	want := []providers.Host{
		{ID: "gpus_12", Addr: "10.0.1.12", Slots: 8, Zone: "eastus-2", Spot: true, Type: "Standard_ND96isr_H100_v5", Launched: t0},
		{ID: "gpus_13", Addr: "10.0.1.13", Slots: 8, Zone: "eastus", Spot: true, Type: "Standard_ND96asr_v4", Launched: t0},
	}
	sameHosts(t, "hosts", got, want)

	// The VM listing asked for the instance view (power states), the NICs came in one
	// listing for the whole set, and every request named an api-version.
	if u := f.last(epVMs); u.Query().Get("$expand") != "instanceView" || u.Query().Get("api-version") == "" {
		t.Errorf("VM listing URL %s: want $expand=instanceView and an api-version", u)
	}
	if n := f.count(epNICs); n != 1 {
		t.Errorf("%d NIC listings for one poll; want 1 for the whole set", n)
	}
}

func TestSpotPriority(t *testing.T) {
	for _, c := range []struct {
		priority string
		spot     bool
	}{{"Spot", true}, {"Low", true}, {"Regular", false}, {"", false}} {
		t.Run(cmp.Or(c.priority, "unset"), func(t *testing.T) {
			f := newFake(t, vm("0", "10.0.0.4"))
			f.setScaleSet(setSpec{SKU: "Standard_NC6s_v3", Priority: c.priority, Mode: "Uniform"})
			got := poll(t, f.provider(t))
			if len(got) != 1 || got[0].Spot != c.spot || got[0].Type != "Standard_NC6s_v3" {
				t.Fatalf("priority %q: hosts %+v; want one host with Spot %v and type Standard_NC6s_v3", c.priority, got, c.spot)
			}
		})
	}
}

func TestPages(t *testing.T) {
	var vms []fakeVM
	for i := range 25 {
		vms = append(vms, vm(strconv.Itoa(i), fmt.Sprintf("10.0.%d.%d", i/200, i%200+4)))
	}
	f := newFake(t, vms...)
	f.setPageSize(10)
	got := poll(t, f.provider(t))
	sameHosts(t, "25 VMs over 3 pages", got, f.wants(vms...))
	if s, v, n := f.count(epSet), f.count(epVMs), f.count(epNICs); s != 1 || v != 3 || n != 3 {
		t.Errorf("calls: scale set %d, VM pages %d, NIC pages %d; want 1, 3, 3", s, v, n)
	}
	// The last VM page was reached through a nextLink, which kept $expand.
	if u := f.last(epVMs); u.Query().Get("$skiptoken") != "20" || u.Query().Get("$expand") != "instanceView" {
		t.Errorf("last VM page URL %s; want $skiptoken=20 with $expand=instanceView", u)
	}
}

// TestCallsGrowWithPagesNotInstances: the first poll costs 1 call for the scale set plus one
// per page of VMs and one per page of NICs, however many VMs a page holds; a poll of a set
// whose VMs all have their addresses known (see addrs_test.go) costs 1 call plus one per page
// of VMs. The fake serves lean entries (the fields the provider reads) so that 10,000 VMs
// decode quickly under -race.
func TestCallsGrowWithPagesNotInstances(t *testing.T) {
	t.Parallel() // it waits, or decodes 10,000 VMs: let the quick tests run meanwhile
	for _, c := range []struct{ vms, pageSize, first, next int }{
		{1, 1000, 3, 2},
		{100, 100, 3, 2},
		{101, 100, 5, 3},
		{250, 10, 51, 26},
		{10_000, 1000, 21, 11},
	} {
		t.Run(fmt.Sprintf("%d/%d", c.vms, c.pageSize), func(t *testing.T) {
			f := newFake(t, manyVMs(c.vms)...)
			f.setLean()
			f.setPageSize(c.pageSize)
			p := f.provider(t)
			if got := poll(t, p); len(got) != c.vms {
				t.Fatalf("%d hosts; want %d", len(got), c.vms)
			}
			if n := f.count(""); n != c.first {
				t.Errorf("%d VMs at %d per page: %d API calls; want %d (1 + 2 per page)", c.vms, c.pageSize, n, c.first)
			}
			if got := poll(t, p); len(got) != c.vms {
				t.Fatalf("next poll: %d hosts; want %d", len(got), c.vms)
			}
			if n := f.count("") - c.first; n != c.next {
				t.Errorf("next poll: %d API calls; want %d (1 + 1 per page of VMs)", n, c.next)
			}
		})
	}
}

func manyVMs(n int) []fakeVM {
	vms := make([]fakeVM, n)
	for i := range vms {
		vms[i] = fakeVM{ID: strconv.Itoa(i), IP: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
			Zone: strconv.Itoa(i%3 + 1), Created: t0.Add(time.Duration(i) * time.Second)}
	}
	return vms
}

func TestPendingVMsAreSkipped(t *testing.T) {
	ready := vm("0", "10.0.0.4")
	noNIC := vm("1", "") // created, no NIC yet
	creating := vm("2", "10.0.0.6")
	creating.Prov, creating.Power = "Creating", "starting" // has its IP, still provisioning
	starting := vm("3", "10.0.0.7")
	starting.Power = "starting" // provisioned, not running yet
	noPower := vm("4", "10.0.0.8")
	noPower.Power = "-" // no power state in the view: taken as running
	updating := vm("5", "10.0.0.9")
	updating.Prov = "Updating" // a model update keeps it running
	f := newFake(t, ready, noNIC, creating, starting, noPower, updating)
	got := poll(t, f.provider(t))
	sameHosts(t, "hosts", got, f.wants(ready, noPower, updating))
}

func TestLeavingVMs(t *testing.T) {
	var vms []fakeVM
	for i, s := range []struct{ prov, power string }{
		{"Succeeded", "running"},
		{"Deleting", "running"},
		{"Succeeded", "stopping"},
		{"Succeeded", "stopped"},
		{"Updating", "deallocating"},
		{"Succeeded", "deallocated"},
	} {
		v := vm(strconv.Itoa(i), fmt.Sprintf("10.0.0.%d", i+4))
		v.Prov, v.Power = s.prov, s.power
		vms = append(vms, v)
	}
	deletingNoNIC := vm("9", "")
	deletingNoNIC.Prov = "Deleting"
	f := newFake(t, append(vms, deletingNoNIC)...)
	p := f.provider(t)
	got := poll(t, p)
	sameHosts(t, "hosts", got, f.wants(vms...))
	for _, h := range got {
		if want := h.ID != "gpus_0"; h.Leaving != want {
			t.Errorf("host %s: Leaving %v; want %v", h.ID, h.Leaving, want)
		}
	}

	// Once deleted, the VM is no longer listed and the host is gone.
	f.setVMs(vms[0], vms[2])
	sameHosts(t, "after the deletion", poll(t, p), f.wants(vms[0], vms[2]))
}

func TestPartialResponses(t *testing.T) {
	f := newFake(t)
	f.queue(epVMs, reply{file: "vms_partial.json"})
	f.queue(epNICs, reply{file: "nics_partial.json"})
	got := poll(t, f.provider(t))
	// null entries, missing properties, views and SKUs are tolerated: a VM whose state is not
	// said is taken as running; one that cannot be joined to an address is skipped.
	want := []providers.Host{
		{ID: "gpus_1", Addr: "10.1.0.1", Slots: 8, Zone: "eastus", Spot: true, Type: "Standard_ND96asr_v4"},
		{ID: "gpus_2", Addr: "10.1.0.2", Slots: 8, Zone: "eastus", Spot: true, Type: "Standard_ND96asr_v4"},
		{ID: "gpus_3", Addr: "10.1.0.3", Slots: 8, Zone: "eastus", Spot: true, Type: "Standard_ND96asr_v4"},
	}
	sameHosts(t, "hosts", got, want)
}

func TestPrimaryNICAndIPv4(t *testing.T) {
	f := newFake(t)
	f.queue(epVMs, reply{file: "vms_multi_nic.json"})
	f.queue(epNICs, reply{file: "nics_multi_nic.json"})
	got := poll(t, f.provider(t))
	want := []providers.Host{{ID: "gpus_7", Addr: "10.0.0.7", Slots: 8, Zone: "eastus-2", Spot: true,
		Type: "Standard_ND96isr_H100_v5", Launched: time.Date(2026, 10, 2, 9, 10, 0, 0, time.UTC)}}
	sameHosts(t, "a VM with an InfiniBand NIC and a dual-stack primary NIC", got, want)
}

func TestMalformedResponses(t *testing.T) {
	for _, c := range []struct {
		name     string
		endpoint string
		reply    reply
		want     string // in the error
	}{
		{"truncated VM page", epVMs, reply{file: "vms_truncated.json"}, "list scale set VMs"},
		{"VM page value not a list", epVMs, reply{file: "vms_value_not_list.json"}, "list scale set VMs"},
		{"HTML from a proxy", epVMs, reply{file: "gateway.html"}, "list scale set VMs"},
		{"VM without name or instanceId", epVMs, reply{file: "vms_no_name.json"}, "neither a name nor an instanceId"},
		{"bad private IP", epNICs, reply{file: "nics_bad_ip.json"}, `"10.0.0.999" is not an IP address`},
		{"scale set not JSON", epSet, reply{file: "scaleset_garbage.json"}, "get scale set"},
		{"empty body", epNICs, reply{raw: []byte{}}, "network interfaces"},
		{"unknown error status", epVMs, reply{status: http.StatusConflict, raw: []byte(`{"error":{"code":"OperationNotAllowed","message":"nope"}}`)}, "HTTP 409 OperationNotAllowed: nope"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, vm("0", "10.0.0.4"))
			f.queue(c.endpoint, c.reply)
			p := f.provider(t)
			err := pollErr(t, p)
			for _, s := range []string{c.want, `scale set "gpus"`, `resource group "ml-rg"`} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			// The next poll, with good answers, recovers.
			sameHosts(t, "the poll after", poll(t, p), f.wants(vm("0", "10.0.0.4")))
		})
	}
}

func TestNextLinkLoopIsBounded(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	loop := []byte(fmt.Sprintf(`{"value":[],"nextLink":%q}`,
		f.srv.URL+"/subscriptions/"+f.sub+"/resourceGroups/ml-rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpus/virtualMachines?api-version=2025-04-01&$skiptoken=x"))
	for range 3 {
		f.queue(epVMs, reply{raw: loop})
	}
	err := pollErr(t, f.provider(t))
	if !strings.Contains(err.Error(), "looping") {
		t.Errorf("error %q; want it to say the API is looping", err)
	}
	if n := f.count(epVMs); n != 2 {
		t.Errorf("%d VM pages fetched; want 2 (the second links to itself)", n)
	}
}

func TestFirstPollErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*azure.Config, *fakeARM)
		want []string
	}{
		{"scale set not found", func(c *azure.Config, _ *fakeARM) { c.VMSS = "gpus-typo" },
			[]string{`scale set "gpus-typo" not found in resource group "ml-rg" of subscription "0b1f6471-1bf0-4dda-aec3-cb9272f09590"`, "ResourceNotFound", "--vmss"}},
		{"resource group not found", func(c *azure.Config, _ *fakeARM) { c.ResourceGroup = "ml-rg-typo" },
			[]string{`resource group "ml-rg-typo" not found in subscription`, `scale set "gpus"`, "--resource-group"}},
		{"subscription not found", func(c *azure.Config, _ *fakeARM) { c.Subscription = "00000000-0000-0000-0000-000000000000" },
			[]string{`subscription "00000000-0000-0000-0000-000000000000" not found`, `scale set "gpus"`, "--subscription"}},
		{"no credentials", func(c *azure.Config, _ *fakeARM) {
			cred := &azfake.TokenCredential{}
			cred.SetError(errors.New("DefaultAzureCredential: failed to acquire a token.\nAttempted credentials:\n\tEnvironmentCredential: missing environment variable AZURE_TENANT_ID\n\tManagedIdentityCredential: no response from the IMDS endpoint"))
			c.Credential = cred
		}, []string{"no usable Azure credentials", "az login", "managed identity", `scale set "gpus"`, `subscription "0b1f6471`, "AZURE_TENANT_ID"}},
		{"token rejected", func(_ *azure.Config, f *fakeARM) {
			f.failEvery(reply{status: http.StatusUnauthorized, file: "error_invalid_token.json"})
		}, []string{"credentials were rejected", "InvalidAuthenticationToken", `scale set "gpus"`, "AZURE_TENANT_ID"}},
		{"no permission", func(_ *azure.Config, f *fakeARM) {
			f.failEvery(reply{status: http.StatusForbidden, file: "error_authorization_failed.json"})
		}, []string{"access denied", "AuthorizationFailed", "Reader role", `resource group "ml-rg"`, `scale set "gpus"`}},
		{"flexible orchestration", func(_ *azure.Config, f *fakeARM) {
			f.setScaleSet(setSpec{SKU: "Standard_ND96asr_v4", Priority: "Spot", Mode: "Flexible"})
		}, []string{"Flexible orchestration", "Uniform", `scale set "gpus"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, vm("0", "10.0.0.4"))
			cfg := f.config(t)
			c.edit(&cfg, f)
			p, err := azure.New(cfg)
			if err != nil {
				t.Fatalf("New: %v; a missing group or credential must show on the first poll, not in New", err)
			}
			err = pollErr(t, p)
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans several lines: %q", err)
			}
			for _, s := range c.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

func TestThrottledRequestWaitsAsAsked(t *testing.T) {
	t.Parallel() // it waits, or decodes 10,000 VMs: let the quick tests run meanwhile
	for _, c := range []struct {
		name   string
		header []string
		wait   time.Duration
	}{
		{"Retry-After seconds", []string{"Retry-After", "1"}, time.Second},
		{"retry-after-ms", []string{"retry-after-ms", "300"}, 300 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, vm("0", "10.0.0.4"))
			f.queue(epVMs, throttled(c.header...))
			p := f.provider(t)
			start := time.Now()
			sameHosts(t, "hosts", poll(t, p), f.wants(vm("0", "10.0.0.4")))
			if took := time.Since(start); took < c.wait {
				t.Errorf("the poll took %v; the server asked for %v before the next try", took, c.wait)
			}
			if s, v, n := f.count(epSet), f.count(epVMs), f.count(epNICs); s != 1 || v != 2 || n != 1 {
				t.Errorf("calls: scale set %d, VMs %d, NICs %d; want 1, 2 (the throttled try and the retry), 1", s, v, n)
			}
			// Recovered: the next poll is an ordinary one, the scale set and its VMs (the VM's
			// address is known: no NIC listing).
			poll(t, p)
			if n := f.count(""); n != 6 {
				t.Errorf("%d calls after two polls; want 6", n)
			}
		})
	}
}

func TestThrottledEndpointWaitsAcrossPolls(t *testing.T) {
	t.Parallel() // it waits, or decodes 10,000 VMs: let the quick tests run meanwhile
	f := newFake(t, vm("0", "10.0.0.4"))
	const retryAfter = 1500 * time.Millisecond
	// Longer than the provider waits inside a poll: the gate of the NIC endpoint remembers it.
	f.queue(epNICs, throttled("Retry-After", "2", "retry-after-ms", strconv.Itoa(int(retryAfter/time.Millisecond))))
	p := f.provider(t, func(c *azure.Config) { c.MaxRetryWait = 100 * time.Millisecond })

	start := time.Now()
	err := pollErr(t, p)
	if !errors.Is(err, azure.ErrThrottled) || !strings.Contains(err.Error(), "network interfaces") {
		t.Errorf("first poll: %v; want ErrThrottled naming the network interface listing", err)
	}
	if took := time.Since(start); took > retryAfter/2 {
		t.Errorf("the throttled poll took %v; a Retry-After past MaxRetryWait must not be waited for inside the poll", took)
	}
	if n := f.count(epNICs); n != 1 {
		t.Errorf("%d NIC calls; want 1: no retry inside the poll", n)
	}
	throttledBy := time.Now() // the gate closed before this, for retryAfter

	// Until Retry-After has passed, polls fail at once without calling any endpoint.
	calls := f.count("")
	for range 3 {
		err := pollErr(t, p)
		if !errors.Is(err, azure.ErrThrottled) || !strings.Contains(err.Error(), "network interfaces") {
			t.Errorf("poll while gated: %v; want ErrThrottled naming the network interface listing", err)
		}
	}
	if n := f.count(""); n != calls {
		t.Errorf("%d calls while the endpoint was gated; want none", n-calls)
	}

	// Then it recovers.
	time.Sleep(time.Until(throttledBy.Add(retryAfter)))
	sameHosts(t, "after Retry-After", poll(t, p), f.wants(vm("0", "10.0.0.4")))
	if n := f.count(epNICs); n != 2 {
		t.Errorf("%d NIC calls; want 2", n)
	}
}

func TestThrottleHonoursPollDeadline(t *testing.T) {
	t.Parallel() // it waits, or decodes 10,000 VMs: let the quick tests run meanwhile
	// A Retry-After within MaxRetryWait but past the poll's deadline is not waited for: the
	// poll fails at once with ErrThrottled instead of running out of time.
	f := newFake(t, vm("0", "10.0.0.4"))
	f.queue(epSet, throttled("Retry-After", "3"))
	p := f.provider(t, func(c *azure.Config) { c.MaxRetryWait = 10 * time.Second })
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := p.Hosts(ctx)
	if !errors.Is(err, azure.ErrThrottled) {
		t.Fatalf("Hosts: %v; want ErrThrottled", err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("took %v; a wait longer than the poll has left must not start", took)
	}
}

func TestMinInterval(t *testing.T) {
	t.Parallel() // it waits, or decodes 10,000 VMs: let the quick tests run meanwhile
	f := newFake(t, vm("0", "10.0.0.4"))
	const interval = 300 * time.Millisecond
	p := f.provider(t, func(c *azure.Config) { c.MinInterval = interval })
	first := poll(t, p)
	start := time.Now()
	f.setVMs(vm("0", "10.0.0.4"), vm("1", "10.0.0.5"))
	for range 5 {
		sameHosts(t, "poll within the interval", poll(t, p), first)
	}
	if n := f.count(""); n != 3 {
		t.Errorf("%d API calls for 6 polls within the interval; want 3 (one refresh)", n)
	}
	time.Sleep(time.Until(start.Add(interval)))
	sameHosts(t, "poll after the interval", poll(t, p), f.wants(vm("0", "10.0.0.4"), vm("1", "10.0.0.5")))
	if n := f.count(""); n != 6 {
		t.Errorf("%d API calls; want 6 (two refreshes)", n)
	}
}

func TestMinIntervalDefault(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	p := f.provider(t, func(c *azure.Config) { c.MinInterval = 0 })
	for range 10 { // the driver's once-a-second polls
		poll(t, p)
	}
	if n := f.count(""); n != 3 {
		t.Errorf("%d API calls for 10 quick polls with the default interval; want 3", n)
	}
}

func TestSlots(t *testing.T) {
	sizes := []string{"Standard_ND96asr_v4", "Standard_NC24ads_A100_v4", "Standard_ND96isr_H100_v5",
		"Standard_NC6s_v3", "Standard_NC64as_T4_v3", "standard_nc48ads_a100_v4", "Standard_D16s_v5"}
	want := []int{8, 1, 8, 1, 4, 2, 1}
	var vms []fakeVM
	for i, s := range sizes {
		v := vm(strconv.Itoa(i), fmt.Sprintf("10.0.0.%d", i+4))
		v.SKU = s
		vms = append(vms, v)
	}
	f := newFake(t, vms...)
	for _, override := range []int{0, 3} {
		got := poll(t, f.provider(t, func(c *azure.Config) { c.SlotsPerHost = override }))
		slices.SortFunc(got, func(a, b providers.Host) int { return cmp.Compare(a.Launched.UnixNano(), b.Launched.UnixNano()) })
		for i, h := range got {
			w := want[i]
			if override > 0 {
				w = override
			}
			if h.Type != sizes[i] || h.Slots != w {
				t.Errorf("--slots-per-host %d: %s has %d slots; want %d", override, h.Type, h.Slots, w)
			}
		}
	}
}

func TestEndpointOverride(t *testing.T) {
	// Every test here reaches the fake through Config.Endpoint; this one checks the
	// override itself: a trailing slash is fine, and nothing is sent anywhere else.
	f := newFake(t, vm("0", "10.0.0.4"))
	p := f.provider(t, func(c *azure.Config) { c.Endpoint = f.srv.URL + "/" })
	sameHosts(t, "hosts", poll(t, p), f.wants(vm("0", "10.0.0.4")))
	if n := f.count(""); n != 3 {
		t.Errorf("%d calls reached the fake; want 3", n)
	}
	// Sovereign clouds and https private endpoints build without touching the network.
	for _, e := range []string{"https://management.usgovcloudapi.net", "https://management.chinacloudapi.cn/", "https://arm.example.internal:8443"} {
		cfg := f.config(t)
		cfg.Endpoint = e
		if _, err := azure.New(cfg); err != nil {
			t.Errorf("New with endpoint %q: %v", e, err)
		}
	}
}

func TestValidate(t *testing.T) {
	good := azure.Config{Subscription: "s", ResourceGroup: "rg", VMSS: "v"}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	for _, c := range []struct {
		edit func(*azure.Config)
		flag string
	}{
		{func(c *azure.Config) { c.Subscription = "" }, "--subscription is required"},
		{func(c *azure.Config) { c.ResourceGroup = " " }, "--resource-group is required"},
		{func(c *azure.Config) { c.VMSS = "" }, "--vmss is required"},
		{func(c *azure.Config) { c.SlotsPerHost = -1 }, "--slots-per-host"},
		{func(c *azure.Config) { c.SlotsPerHost = providers.MaxSlots + 1 }, "--slots-per-host"},
		{func(c *azure.Config) { c.Endpoint = "management.azure.com" }, "--endpoint"},
		{func(c *azure.Config) { c.Endpoint = "http://10.1.2.3:8080" }, "plain http is allowed only to a loopback address"},
		{func(c *azure.Config) { c.Endpoint = "ftp://x" }, "--endpoint"},
		{func(c *azure.Config) { c.Endpoint = "https://x/?a=b" }, "--endpoint"},
		{func(c *azure.Config) { c.MinInterval = -time.Second }, "minimum refresh interval"},
		{func(c *azure.Config) { c.MaxRetryWait = -time.Second }, "maximum retry wait"},
	} {
		cfg := good
		c.edit(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("Validate(%+v) = %v; want an error naming %q", cfg, err, c.flag)
			continue
		}
		if _, nerr := azure.New(cfg); nerr == nil {
			t.Errorf("New accepted %+v", cfg)
		}
	}
}

// TestGPUTableMatchesDocs keeps docs/providers/azure.md and the provider in agreement: each
// size in the doc's table gets its documented GPU count as slots.
func TestGPUTableMatchesDocs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/providers/azure.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := regexp.MustCompile("(?m)^\\| `(Standard_[A-Za-z0-9_]+)` +\\| (\\d+) ").FindAllStringSubmatch(string(doc), -1)
	if len(rows) < 20 {
		t.Fatalf("found %d GPU table rows in the doc; want the whole table", len(rows))
	}
	var vms []fakeVM
	want := map[string]int{}
	for i, r := range rows {
		n, _ := strconv.Atoi(r[2])
		want[r[1]] = n
		v := vm(strconv.Itoa(i), fmt.Sprintf("10.0.%d.%d", i/200, i%200+4))
		v.SKU = r[1]
		vms = append(vms, v)
	}
	f := newFake(t, vms...)
	for _, h := range poll(t, f.provider(t)) {
		if h.Slots != want[h.Type] {
			t.Errorf("%s: the provider gives %d slots, the doc says %d GPUs", h.Type, h.Slots, want[h.Type])
		}
	}
	// And the other way: the provider knows no size that the doc leaves out.
	if got := azure.GPUSizes(); got != len(rows) {
		t.Errorf("the provider's table has %d sizes, the doc's %d", got, len(rows))
	}
}
