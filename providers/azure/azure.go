// Package azure lists the hosts of an Azure virtual machine scale set (Uniform orchestration)
// through Azure Resource Manager, and steers its capacity: one refresh per Hosts call at
// most, no goroutines.
package azure

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"

	"github.com/elasticd/elasticd/providers"
)

// Defaults of Config.
const (
	// DefaultMinInterval is the least time between two refreshes from the API. The driver
	// polls every second; a scale set's VMs change over tens of seconds, and ARM's read
	// budget is shared by everything else in the subscription.
	DefaultMinInterval = 5 * time.Second
	// DefaultMaxRetryWait is the longest Retry-After the SDK waits for inside one poll; a
	// longer one is honoured across polls instead (see throttle.go).
	DefaultMaxRetryWait = 5 * time.Second
)

// Config says which scale set to list and how. Subscription, ResourceGroup and VMSS are
// required; the zero value of every other field takes its default.
type Config struct {
	Subscription  string // --subscription: the subscription ID
	ResourceGroup string // --resource-group
	VMSS          string // --vmss: the scale set's name
	// Endpoint overrides the Azure Resource Manager endpoint (--endpoint): a sovereign cloud
	// (https://management.usgovcloudapi.net, https://management.chinacloudapi.cn), a private
	// endpoint, or a test server. Plain http is accepted only for a loopback address.
	// Default: the public cloud, https://management.azure.com.
	Endpoint string
	// SlotsPerHost, when positive, is every host's slot count (--slots-per-host); otherwise
	// the VM size's GPU count from the table in gpus.go, else 1.
	SlotsPerHost int
	// MinInterval is the least time between refreshes (default DefaultMinInterval): a poll
	// sooner than that after a successful refresh returns the cached hosts without calling
	// the API.
	MinInterval time.Duration
	// MaxRetryWait is the longest Retry-After waited for inside one poll (default
	// DefaultMaxRetryWait); never longer than what is left of the poll's context.
	MaxRetryWait time.Duration
	// Credential authenticates to ARM; nil means azidentity's DefaultAzureCredential
	// (environment, workload identity, managed identity, Azure CLI, …).
	Credential azcore.TokenCredential
	// Logger receives throttling warnings; nil discards them.
	Logger *slog.Logger
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	if c.MinInterval == 0 {
		c.MinInterval = DefaultMinInterval
	}
	if c.MaxRetryWait == 0 {
		c.MaxRetryWait = DefaultMaxRetryWait
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first invalid field, named by its flag.
func (c Config) Validate() error {
	switch {
	case strings.TrimSpace(c.Subscription) == "":
		return errors.New("--subscription is required: the ID of the Azure subscription that holds the scale set")
	case strings.TrimSpace(c.ResourceGroup) == "":
		return errors.New("--resource-group is required: the resource group of the scale set")
	case strings.TrimSpace(c.VMSS) == "":
		return errors.New("--vmss is required: the name of the virtual machine scale set")
	case c.SlotsPerHost < 0 || c.SlotsPerHost > providers.MaxSlots:
		return fmt.Errorf("--slots-per-host %d: must be between 1 and %d (0: the VM size's GPU count)", c.SlotsPerHost, providers.MaxSlots)
	case c.MinInterval < 0:
		return fmt.Errorf("minimum refresh interval %v: must not be negative (0: %v)", c.MinInterval, DefaultMinInterval)
	case c.MaxRetryWait < 0:
		return fmt.Errorf("maximum retry wait %v: must not be negative (0: %v)", c.MaxRetryWait, DefaultMaxRetryWait)
	}
	if c.Endpoint != "" {
		if _, err := parseEndpoint(c.Endpoint); err != nil {
			return fmt.Errorf("--endpoint %q: %w", c.Endpoint, err)
		}
	}
	return nil
}

// parseEndpoint checks an ARM endpoint override: an absolute https URL, or http to a
// loopback address only, since the bearer token travels with every request.
func parseEndpoint(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	switch {
	case u.Host == "" || (u.Scheme != "https" && u.Scheme != "http"):
		return nil, errors.New("want an absolute URL such as https://management.azure.com")
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return nil, errors.New("want a bare URL, without user, query or fragment")
	case u.Scheme == "http" && !loopback(u.Hostname()):
		return nil, errors.New("plain http is allowed only to a loopback address (a test server): the bearer token would travel in clear; use https")
	}
	return u, nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Provider lists the VMs of one scale set. It is safe for concurrent use: polls are
// serialised, and one that arrives while another refreshes gets that refresh's result.
type Provider struct {
	cfg   Config
	api   api
	log   *slog.Logger
	where string // the scale set, its resource group and subscription, after "azure: "

	// loop is the portable part: one poll at a time, the reuse of hosts within
	// MinInterval, each endpoint's gate (keyed by opScaleSet, opVMs, opNICs; throttle.go),
	// the "azure: " prefix.
	loop *providers.Loop

	// writeTurn is held by the capacity call in progress (SetDesired, Replace).
	writeTurn chan struct{}
	// lroEvery is how often a long-running operation is polled when ARM names no Retry-After.
	lroEvery time.Duration

	mu       sync.Mutex                // guards failures: small, never held across a call
	failures []providers.LaunchFailure // from failed LROs, oldest first, at most keptFailures

	// addrs are the private IPs of the VMs of the last good refresh, by host ID; only the
	// refresh in progress (one at a time, under the loop) reads or writes them. They spare
	// the NIC listing on the polls where no VM is new or back to running (needNICs).
	addrs map[string]knownAddr
}

// driver is the cloud's own part of the provider, under the loop: its SDK calls.
type driver struct{ p *Provider }

// New makes a provider; it does not call the network: a missing scale set or credential
// shows on the first poll, with what to fix.
func New(cfg Config) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cred := cfg.Credential
	if cred == nil {
		c, err := azidentity.NewDefaultAzureCredential(nil)
		if err != nil {
			return nil, fmt.Errorf("azure credentials: %w", err)
		}
		cred = c
	}
	a, err := newSDK(cfg, cred)
	if err != nil {
		return nil, err
	}
	return newProvider(cfg, a), nil
}

func newProvider(cfg Config, a api) *Provider {
	p := &Provider{
		cfg: cfg,
		api: a,
		log: cfg.Logger.With("provider", "azure"),
		where: fmt.Sprintf("scale set %q (resource group %q, subscription %q)",
			cfg.VMSS, cfg.ResourceGroup, cfg.Subscription),
		writeTurn: make(chan struct{}, 1),
		lroEvery:  DefaultLROPollInterval,
	}
	// One request per Call: the SDK retries within a request (throttle.go).
	p.loop = providers.NewLoop(providers.LoopConfig{
		Name: "azure", Where: func() string { return p.where }, MinInterval: cfg.MinInterval,
		Tries: 1, Logger: p.log,
	}, driver{p})
	return p
}

// Hosts lists the scale set's VMs that have a private IP. A VM being deleted, stopped or
// deallocated is listed with Leaving set; one still being created or started is not listed.
// Within MinInterval of the last successful refresh it returns that refresh's hosts.
func (p *Provider) Hosts(ctx context.Context) ([]providers.Host, error) {
	return p.loop.Hosts(ctx)
}

// ListHosts is one refresh from the API.
func (d driver) ListHosts(ctx context.Context) ([]providers.Host, error) { return d.p.refresh(ctx) }

// refresh reads the scale set and its VMs, a page at a time, and the set's network
// interfaces only when a VM's address must be read (needNICs): 1 + pages of VMs calls, and
// the pages of NICs on those polls.
func (p *Provider) refresh(ctx context.Context) ([]providers.Host, error) {
	if err := p.open(); err != nil {
		return nil, err
	}
	ss, err := callOnce(ctx, p, opScaleSet, p.api.scaleSet)
	if err != nil {
		return nil, p.explain(ctx, opScaleSet, err)
	}
	if ss.ID == nil && ss.Name == nil {
		return nil, fmt.Errorf("%s: the answer names no scale set: the response is malformed", opScaleSet)
	}
	if err := uniform(ss); err != nil {
		return nil, err
	}
	vms, err := p.listVMs(ctx, setOf(ss))
	if err != nil {
		return nil, err
	}
	if len(vms) == 0 {
		p.addrs = nil
		return nil, nil
	}
	var nics *nicAddrs
	if p.needNICs(vms) {
		if nics, err = p.listNICs(ctx); err != nil {
			return nil, err
		}
	}
	return p.join(vms, nics), nil
}

// uniform is nil for a Uniform scale set: the VM and NIC listings are Uniform-only.
func uniform(ss armcompute.VirtualMachineScaleSet) error {
	if ss.Properties != nil && ss.Properties.OrchestrationMode != nil &&
		*ss.Properties.OrchestrationMode == armcompute.OrchestrationModeFlexible {
		return errors.New("uses Flexible orchestration; elasticd lists Uniform scale sets only " +
			"(create it with orchestration mode Uniform, e.g. azurerm_linux_virtual_machine_scale_set)")
	}
	return nil
}

// vmState is what a VM's provisioning and power states mean to the job.
type vmState int

const (
	ready   vmState = iota // running (or nothing says otherwise): listed
	pending                // being created or started: not listed yet
	leaving                // being deleted, stopped or deallocated: listed with Leaving
)

// states are a VM's provisioning state and power state (the code after "PowerState/"), in
// lower case; "" when the answer does not say.
func states(vm *armcompute.VirtualMachineScaleSetVM) (prov, power string) {
	props := vm.Properties
	if props == nil {
		return "", ""
	}
	prov = strings.ToLower(deref(props.ProvisioningState))
	if iv := props.InstanceView; iv != nil {
		for _, s := range iv.Statuses {
			if s == nil {
				continue
			}
			if code, ok := strings.CutPrefix(strings.ToLower(deref(s.Code)), "powerstate/"); ok {
				power = code
			}
		}
	}
	return prov, power
}

// stateOf classifies a VM. A spot eviction with the Deallocate policy shows as
// deallocating then deallocated; with the Delete policy as Deleting, then the VM is gone.
func stateOf(prov, power string) vmState {
	switch {
	case prov == "deleting", power == "stopping", power == "stopped", power == "deallocating", power == "deallocated":
		return leaving
	case prov == "creating", power == "starting":
		return pending
	}
	return ready
}

// setFacts is what the scale set says of every VM in it.
type setFacts struct {
	spot     bool
	size     string // the model's VM size
	location string // lower case
}

func setOf(ss armcompute.VirtualMachineScaleSet) setFacts {
	f := setFacts{location: strings.ToLower(deref(ss.Location))}
	if ss.SKU != nil {
		f.size = deref(ss.SKU.Name)
	}
	if ss.Properties != nil && ss.Properties.VirtualMachineProfile != nil {
		switch pr := ss.Properties.VirtualMachineProfile.Priority; {
		case pr == nil:
		case *pr == armcompute.VirtualMachinePriorityTypesSpot, *pr == armcompute.VirtualMachinePriorityTypesLow:
			f.spot = true
		}
	}
	return f
}

// vmRecord is what a poll keeps of one VM of the listing, the SDK's structs of its page
// being dropped once the page is read: its host but for the address, its state, and what
// joins it to its NICs.
type vmRecord struct {
	host  providers.Host // Addr is set by join
	state vmState
	// steady: provisioned (Succeeded) and running, the state in which its NIC and address
	// stay as they are.
	steady bool
	id     string   // its resource ID, which its NICs name
	nics   []nicRef // the NICs of its network profile
}

type nicRef struct {
	id      string
	primary bool
}

// listVMs lists the scale set's VMs as records, in the API's order, a page at a time.
func (p *Provider) listVMs(ctx context.Context, set setFacts) ([]vmRecord, error) {
	var vms []vmRecord
	n := 0 // VMs of the listing so far, for an error that names one
	var bad error
	err := walk(ctx, p, opVMs, p.api.vms(), func(page []*armcompute.VirtualMachineScaleSetVM) error {
		for _, vm := range page {
			n++
			if vm == nil {
				continue // a null entry says nothing
			}
			id := deref(vm.Name)
			if id == "" && deref(vm.InstanceID) != "" {
				id = p.cfg.VMSS + "_" + deref(vm.InstanceID)
			}
			if id == "" {
				bad = fmt.Errorf("VM %d of the listing has neither a name nor an instanceId: the response is malformed", n-1)
				return bad
			}
			vms = append(vms, p.record(vm, id, set))
		}
		return nil
	})
	switch {
	case bad != nil:
		return nil, fmt.Errorf("%s: %w", opVMs, bad)
	case err != nil:
		return nil, p.explain(ctx, opVMs, err)
	}
	return vms, nil
}

// record is what a poll keeps of vm, whose host ID is id.
func (p *Provider) record(vm *armcompute.VirtualMachineScaleSetVM, id string, set setFacts) vmRecord {
	prov, power := states(vm)
	state := stateOf(prov, power)
	h := providers.Host{ID: id, Spot: set.spot, Type: set.size, Leaving: state == leaving}
	if vm.SKU != nil && deref(vm.SKU.Name) != "" {
		h.Type = *vm.SKU.Name // a VM keeps its size until it is upgraded to a new model
	}
	h.Slots = providers.SlotsFor(strings.ToLower(h.Type), gpus, p.cfg.SlotsPerHost)
	loc := cmp.Or(strings.ToLower(deref(vm.Location)), set.location)
	h.Zone = loc
	if len(vm.Zones) > 0 && deref(vm.Zones[0]) != "" {
		h.Zone = loc + "-" + *vm.Zones[0]
	}
	r := vmRecord{host: h, state: state, steady: prov == "succeeded" && power == "running", id: deref(vm.ID)}
	if props := vm.Properties; props != nil {
		if props.TimeCreated != nil {
			r.host.Launched = *props.TimeCreated
		}
		if props.NetworkProfile != nil {
			for _, ref := range props.NetworkProfile.NetworkInterfaces {
				if ref != nil {
					r.nics = append(r.nics, nicRef{id: deref(ref.ID), primary: ref.Properties != nil && deref(ref.Properties.Primary)})
				}
			}
		}
	}
	return r
}

// knownAddr is a VM's private IP as the last NIC listing that saw the VM gave it.
type knownAddr struct {
	addr     string    // "" when that listing had none for it
	launched time.Time // the VM's creation time: another VM under the same name is not this one
	// settled: read while the VM was steady, and steady at every poll since, so its
	// address cannot have changed (a NIC keeps its private IP while it exists; a VM keeps
	// its NICs until it is deleted, and a model upgrade or a start goes through another state).
	settled bool
}

// needNICs says whether this poll must list the NICs: a VM to be listed has no address
// known (it is new, or another VM under the same name), or runs with none known to hold,
// being new to the running state or not steady.
func (p *Provider) needNICs(vms []vmRecord) bool {
	for _, r := range vms {
		k, ok := p.addrs[r.host.ID]
		switch {
		case r.state == pending:
		case !ok || !k.launched.Equal(r.host.Launched):
			return true
		case r.state == ready && !(k.settled && r.steady && k.addr != ""):
			return true
		}
	}
	return false
}

// join gives each VM its address, from nics when this poll listed them, else from the
// addresses known, and returns the hosts of the VMs that have one, in the API's order. The
// addresses known are replaced by those of this listing's VMs: a VM that is gone, or
// pending, is forgotten.
func (p *Provider) join(vms []vmRecord, nics *nicAddrs) []providers.Host {
	known := make(map[string]knownAddr, len(vms))
	hosts := make([]providers.Host, 0, len(vms))
	for _, r := range vms {
		if r.state == pending {
			continue
		}
		if prev, dup := known[r.host.ID]; dup && prev.addr != "" {
			continue // listed already: the set changed between pages
		}
		k := p.addrs[r.host.ID] // needNICs made sure it is there when nics is nil
		if nics != nil {
			k = knownAddr{addr: nics.of(r), launched: r.host.Launched, settled: r.steady}
		} else {
			k.settled = k.settled && r.steady
		}
		known[r.host.ID] = k
		if k.addr == "" {
			continue // no private IP yet (or any more): nothing to connect to
		}
		h := r.host
		h.Addr = k.addr
		hosts = append(hosts, h)
	}
	p.addrs = known
	return hosts
}

// listNICs lists the scale set's network interfaces, a page at a time, as addresses.
func (p *Provider) listNICs(ctx context.Context) (*nicAddrs, error) {
	a := &nicAddrs{byVM: map[string]string{}, byNIC: map[string]string{}, primaryOf: map[string]bool{}}
	var bad error
	err := walk(ctx, p, opNICs, p.api.nics(), func(page []*armnetwork.Interface) error {
		bad = a.add(page)
		return bad
	})
	switch {
	case bad != nil:
		return nil, fmt.Errorf("%s: %w", opNICs, bad)
	case err != nil:
		return nil, p.explain(ctx, opNICs, err)
	}
	return a, nil
}

// nicAddrs finds a VM's private IP: by the VM's resource ID (which the NIC names), else by
// the NIC IDs in the VM's network profile. Keys are lower case: ARM IDs are case-insensitive
// and the network API often spells the resource group in capitals.
type nicAddrs struct {
	byVM      map[string]string
	byNIC     map[string]string
	primaryOf map[string]bool // VMs whose address in byVM is their primary NIC's
}

func (a *nicAddrs) of(r vmRecord) string {
	if ip := a.byVM[strings.ToLower(r.id)]; ip != "" {
		return ip
	}
	var first string
	for _, ref := range r.nics {
		ip := a.byNIC[strings.ToLower(ref.id)]
		if ip != "" && ref.primary {
			return ip
		}
		first = cmp.Or(first, ip)
	}
	return first
}

// add maps the VMs and NICs of one page to the private IP of each NIC's primary IP
// configuration. A VM with several NICs gets its primary NIC's address.
func (a *nicAddrs) add(nics []*armnetwork.Interface) error {
	for _, nic := range nics {
		if nic == nil || nic.Properties == nil {
			continue
		}
		ip, err := privateIP(nic.Properties.IPConfigurations)
		if err != nil {
			return fmt.Errorf("network interface %q: %w", deref(nic.ID), err)
		}
		if ip == "" {
			continue
		}
		if id := strings.ToLower(deref(nic.ID)); id != "" {
			a.byNIC[id] = ip
		}
		if nic.Properties.VirtualMachine == nil {
			continue
		}
		vm := strings.ToLower(deref(nic.Properties.VirtualMachine.ID))
		primary := deref(nic.Properties.Primary)
		if vm != "" && (a.byVM[vm] == "" || (primary && !a.primaryOf[vm])) {
			a.byVM[vm], a.primaryOf[vm] = ip, primary
		}
	}
	return nil
}

// privateIP is the private address of the primary IP configuration (else the first one that
// has an address), or "" when none has one yet.
func privateIP(cfgs []*armnetwork.InterfaceIPConfiguration) (string, error) {
	var first string
	for _, c := range cfgs {
		if c == nil || c.Properties == nil || deref(c.Properties.PrivateIPAddress) == "" {
			continue
		}
		s := *c.Properties.PrivateIPAddress
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Zone() != "" {
			return "", fmt.Errorf("private IP address %q is not an IP address", s)
		}
		if deref(c.Properties.Primary) {
			return ip.String(), nil
		}
		first = cmp.Or(first, ip.String())
	}
	return first, nil
}

func deref[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}
