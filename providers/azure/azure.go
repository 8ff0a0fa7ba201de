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

// refresh reads the scale set, its VMs and its network interfaces: 1 + pages + pages calls.
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
	vms, err := collect(ctx, p, opVMs, p.api.vms())
	if err != nil {
		return nil, p.explain(ctx, opVMs, err)
	}
	if len(vms) == 0 {
		return nil, nil
	}
	nics, err := collect(ctx, p, opNICs, p.api.nics())
	if err != nil {
		return nil, p.explain(ctx, opNICs, err)
	}
	addrs, err := addresses(nics)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opNICs, err)
	}
	hosts, err := p.hostsOf(ss, vms, addrs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opVMs, err)
	}
	return hosts, nil
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

// stateOf classifies a VM. A spot eviction with the Deallocate policy shows as
// deallocating then deallocated; with the Delete policy as Deleting, then the VM is gone.
func stateOf(vm *armcompute.VirtualMachineScaleSetVM) vmState {
	var prov, power string
	if props := vm.Properties; props != nil {
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
	}
	switch {
	case prov == "deleting", power == "stopping", power == "stopped", power == "deallocating", power == "deallocated":
		return leaving
	case prov == "creating", power == "starting":
		return pending
	}
	return ready
}

// hostsOf turns the VMs into hosts, in the API's order, skipping those without an address.
func (p *Provider) hostsOf(ss armcompute.VirtualMachineScaleSet, vms []*armcompute.VirtualMachineScaleSetVM, addrs nicAddrs) ([]providers.Host, error) {
	spot := false
	setType, location := "", strings.ToLower(deref(ss.Location))
	if ss.SKU != nil {
		setType = deref(ss.SKU.Name)
	}
	if ss.Properties != nil && ss.Properties.VirtualMachineProfile != nil {
		switch pr := ss.Properties.VirtualMachineProfile.Priority; {
		case pr == nil:
		case *pr == armcompute.VirtualMachinePriorityTypesSpot, *pr == armcompute.VirtualMachinePriorityTypesLow:
			spot = true
		}
	}
	hosts := make([]providers.Host, 0, len(vms))
	seen := make(map[string]bool, len(vms))
	for i, vm := range vms {
		if vm == nil {
			continue // a null entry says nothing
		}
		id := deref(vm.Name)
		if id == "" && deref(vm.InstanceID) != "" {
			id = p.cfg.VMSS + "_" + deref(vm.InstanceID)
		}
		if id == "" {
			return nil, fmt.Errorf("VM %d of the listing has neither a name nor an instanceId: the response is malformed", i)
		}
		if seen[id] { // listed twice while the set changed between pages
			continue
		}
		state := stateOf(vm)
		if state == pending {
			continue
		}
		addr := addrs.of(vm)
		if addr == "" {
			continue // no private IP yet (or any more): nothing to connect to
		}
		seen[id] = true
		h := providers.Host{ID: id, Addr: addr, Spot: spot, Type: setType, Leaving: state == leaving}
		if vm.SKU != nil && deref(vm.SKU.Name) != "" {
			h.Type = *vm.SKU.Name // a VM keeps its size until it is upgraded to a new model
		}
		h.Slots = providers.SlotsFor(strings.ToLower(h.Type), gpus, p.cfg.SlotsPerHost)
		loc := cmp.Or(strings.ToLower(deref(vm.Location)), location)
		h.Zone = loc
		if len(vm.Zones) > 0 && deref(vm.Zones[0]) != "" {
			h.Zone = loc + "-" + *vm.Zones[0]
		}
		if vm.Properties != nil && vm.Properties.TimeCreated != nil {
			h.Launched = *vm.Properties.TimeCreated
		}
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// nicAddrs finds a VM's private IP: by the VM's resource ID (which the NIC names), else by
// the NIC IDs in the VM's network profile. Keys are lower case: ARM IDs are case-insensitive
// and the network API often spells the resource group in capitals.
type nicAddrs struct {
	byVM  map[string]string
	byNIC map[string]string
}

func (a nicAddrs) of(vm *armcompute.VirtualMachineScaleSetVM) string {
	if ip := a.byVM[strings.ToLower(deref(vm.ID))]; ip != "" {
		return ip
	}
	if vm.Properties == nil || vm.Properties.NetworkProfile == nil {
		return ""
	}
	var first string
	for _, ref := range vm.Properties.NetworkProfile.NetworkInterfaces {
		if ref == nil {
			continue
		}
		ip := a.byNIC[strings.ToLower(deref(ref.ID))]
		if ip != "" && ref.Properties != nil && deref(ref.Properties.Primary) {
			return ip
		}
		first = cmp.Or(first, ip)
	}
	return first
}

// addresses maps VMs and NICs to the private IP of each NIC's primary IP configuration. A
// VM with several NICs gets its primary NIC's address.
func addresses(nics []*armnetwork.Interface) (nicAddrs, error) {
	a := nicAddrs{byVM: make(map[string]string, len(nics)), byNIC: make(map[string]string, len(nics))}
	primaryOf := make(map[string]bool, len(nics))
	for _, nic := range nics {
		if nic == nil || nic.Properties == nil {
			continue
		}
		ip, err := privateIP(nic.Properties.IPConfigurations)
		if err != nil {
			return nicAddrs{}, fmt.Errorf("network interface %q: %w", deref(nic.ID), err)
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
		if vm != "" && (a.byVM[vm] == "" || (primary && !primaryOf[vm])) {
			a.byVM[vm], primaryOf[vm] = ip, primary
		}
	}
	return a, nil
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
