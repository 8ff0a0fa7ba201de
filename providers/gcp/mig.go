package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/elasticd/elasticd/providers"
	"google.golang.org/api/googleapi"
)

// maxPages bounds every list: 1,000 pages of up to 500 is far beyond any MIG, and a server
// that keeps handing out page tokens must not keep a poll going until its deadline.
const maxPages = 1000

// poll lists the group once: its managed instances (one request per page), then, in each
// zone that has some, the instances whose names match theirs (one request per page), joined
// by name. Requests grow with pages, never with instances.
func (p *Provider) poll(ctx context.Context) ([]providers.Host, error) {
	if err := p.ensureAPI(ctx); err != nil {
		return nil, err
	}

	managed, err := p.listManaged(ctx)
	if err != nil {
		return nil, p.explain(err, "list managed instances")
	}

	// The instances of each zone, by name; a managed instance without an instance yet
	// (CREATING) has no URL and is skipped, as it has no address.
	byZone := map[string][]*computepb.ManagedInstance{}
	for _, mi := range managed {
		zone, _, ok := zoneAndName(mi.GetInstance())
		if !ok {
			if mi.GetInstance() != "" {
				p.log.Warn("skipping a managed instance with an unexpected instance URL", "host", mi.GetName(), "url", mi.GetInstance())
			}
			continue
		}
		byZone[zone] = append(byZone[zone], mi)
	}
	zones := make([]string, 0, len(byZone))
	for z := range byZone {
		zones = append(zones, z)
	}
	slices.Sort(zones)

	hosts := make([]providers.Host, 0, len(managed))
	seen := make(map[string]bool, len(managed))
	for _, zone := range zones {
		mis := byZone[zone]
		insts, err := p.listInstances(ctx, zone, nameFilter(mis))
		if err != nil {
			return nil, p.explain(err, fmt.Sprintf("list instances in zone %q", zone))
		}
		for _, mi := range mis {
			_, name, _ := zoneAndName(mi.GetInstance())
			in := insts[name]
			if in == nil {
				continue // created or deleted between the two lists: next poll
			}
			h, ok := p.host(mi, in)
			if !ok || seen[h.ID] {
				continue
			}
			seen[h.ID] = true
			hosts = append(hosts, h)
		}
	}
	return hosts, nil
}

// ensureAPI makes the SDK clients if there are none; the caller holds apiTurn.
func (p *Provider) ensureAPI(ctx context.Context) error {
	if p.api != nil {
		return nil
	}
	api, err := newSDKAPI(ctx, p.cfg)
	if err != nil {
		return fmt.Errorf("make the Compute Engine client (credentials come from "+
			"Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth "+
			"application-default login`, or the VM's service account): %w", err)
	}
	p.api = api
	return nil
}

// listManaged returns every page of the MIG's managed instances.
func (p *Provider) listManaged(ctx context.Context) ([]*computepb.ManagedInstance, error) {
	var all []*computepb.ManagedInstance
	err := pages(func(token string) (string, error) {
		var items []*computepb.ManagedInstance
		var next string
		err := p.call(ctx, epManaged, func(ctx context.Context) (err error) {
			items, next, err = p.api.listManagedInstances(ctx, token)
			return err
		})
		all = append(all, items...)
		return next, err
	})
	return all, err
}

// listInstances returns every page of the zone's instances that match filter, by name.
func (p *Provider) listInstances(ctx context.Context, zone, filter string) (map[string]*computepb.Instance, error) {
	byName := map[string]*computepb.Instance{}
	err := pages(func(token string) (string, error) {
		var items []*computepb.Instance
		var next string
		err := p.call(ctx, epInstances, func(ctx context.Context) (err error) {
			items, next, err = p.api.listInstances(ctx, zone, filter, token)
			return err
		})
		for _, in := range items {
			byName[in.GetName()] = in
		}
		return next, err
	})
	return byName, err
}

// pages calls fetch with each page token in turn, from the first page ("") until a page has
// no next token: at most maxPages, and never the same token twice.
func pages(fetch func(token string) (next string, err error)) error {
	seen := map[string]bool{}
	token := ""
	for range maxPages {
		next, err := fetch(token)
		if err != nil {
			return err
		}
		if next == "" {
			return nil
		}
		if seen[next] {
			return fmt.Errorf("the API returned page token %q twice; giving up rather than loop", clip(next))
		}
		seen[next] = true
		token = next
	}
	return fmt.Errorf("more than %d pages; giving up rather than loop", maxPages)
}

// nameFilter narrows a zone's instance list to names that start like the managed
// instances' names (a MIG names its instances <base-instance-name>-<suffix>). The filter's
// `eq` takes an RE2 expression that must match the whole name. Names are [a-z0-9-], so the
// prefix needs no quoting. With no common prefix (per-instance names) the list is the zone's.
func nameFilter(mis []*computepb.ManagedInstance) string {
	prefix := ""
	for i, mi := range mis {
		_, name, _ := zoneAndName(mi.GetInstance())
		if i == 0 {
			prefix = name
			continue
		}
		n := 0
		for n < len(prefix) && n < len(name) && prefix[n] == name[n] {
			n++
		}
		prefix = prefix[:n]
	}
	if prefix == "" || strings.Trim(prefix, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
		return ""
	}
	return `name eq "` + prefix + `.*"`
}

// zoneAndName splits an instance URL, …/projects/P/zones/Z/instances/N.
func zoneAndName(url string) (zone, name string, ok bool) {
	parts := strings.Split(url, "/")
	n := len(parts)
	if n < 4 || parts[n-4] != "zones" || parts[n-2] != "instances" || parts[n-3] == "" || parts[n-1] == "" {
		return "", "", false
	}
	return parts[n-3], parts[n-1], true
}

// lastSegment is the last path segment of a resource URL (a zone's or machine type's name).
func lastSegment(url string) string {
	return url[strings.LastIndexByte(url, '/')+1:]
}

// Leaving. A managed instance is on its way out when the MIG is deleting, abandoning (it
// leaves the group, though it runs on), recreating, restarting, stopping or suspending it, or
// when the instance itself is stopping, suspending or already down (a preempted spot VM goes
// STOPPING, then TERMINATED). Such an instance is listed with Leaving set while it still has
// an address, so the job moves off it at once; the MIG's other actions (CREATING, VERIFYING,
// REFRESHING, STARTING, RESUMING, NONE) leave it alone.
var (
	leavingActions = map[string]bool{
		"DELETING": true, "ABANDONING": true, "RECREATING": true,
		"RESTARTING": true, "STOPPING": true, "SUSPENDING": true,
	}
	leavingStatuses = map[string]bool{
		"STOPPING": true, "PENDING_STOP": true, "SUSPENDING": true, "DEPROVISIONING": true,
		"STOPPED": true, "SUSPENDED": true, "TERMINATED": true,
	}
)

// host turns a managed instance and its instance into a Host; ok is false for an instance
// that cannot run workers yet (no address, or not RUNNING and not leaving).
func (p *Provider) host(mi *computepb.ManagedInstance, in *computepb.Instance) (providers.Host, bool) {
	status := in.GetStatus()
	if status == "" {
		status = mi.GetInstanceStatus()
	}
	leaving := leavingActions[mi.GetCurrentAction()] || leavingStatuses[status] || leavingStatuses[mi.GetInstanceStatus()]
	addr := ""
	if nics := in.GetNetworkInterfaces(); len(nics) > 0 {
		addr = nics[0].GetNetworkIP()
		if addr == "" {
			addr = nics[0].GetIpv6Address() // an IPv6-only subnet
		}
	}
	id := in.GetId()
	if id == 0 {
		id = mi.GetId()
	}
	switch {
	case addr == "":
		return providers.Host{}, false // pending: no address yet
	case status != "RUNNING" && !leaving:
		return providers.Host{}, false // PROVISIONING, STAGING, REPAIRING…: not up yet
	case id == 0:
		p.log.Warn("skipping an instance with no ID in the API's answer", "host", in.GetName())
		return providers.Host{}, false
	}
	typ := lastSegment(in.GetMachineType())
	sched := in.GetScheduling()
	launched, _ := time.Parse(time.RFC3339Nano, in.GetCreationTimestamp()) // zero when unknown
	return providers.Host{
		ID:       strconv.FormatUint(id, 10),
		Addr:     addr,
		Slots:    slots(typ, in.GetGuestAccelerators(), p.cfg.SlotsPerHost),
		Zone:     lastSegment(in.GetZone()),
		Spot:     sched.GetProvisioningModel() == "SPOT" || sched.GetPreemptible(),
		Type:     typ,
		Launched: launched,
		Leaving:  leaving,
	}, true
}

// slots is the host's slot count: the override when positive, else the GPUs attached to the
// instance (guestAccelerators; N1 VMs get theirs this way), else the machine type's GPUs
// from gpus, else 1.
func slots(machineType string, accels []*computepb.AcceleratorConfig, override int) int {
	if override <= 0 {
		n := 0
		for _, a := range accels {
			n += int(max(a.GetAcceleratorCount(), 0))
		}
		override = min(n, providers.MaxSlots)
	}
	return providers.SlotsFor(machineType, gpus, override)
}

// explain wraps a failed list with the group and, where the API said why, what to fix.
func (p *Provider) explain(err error, what string) error {
	loc, other := "--zone", "a regional MIG needs --region instead of --zone"
	if p.cfg.Region != "" {
		loc, other = "--region", "a zonal MIG needs --zone instead of --region"
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		switch {
		case ge.Code == http.StatusNotFound && what == "list managed instances":
			return fmt.Errorf("%s: the group was not found (HTTP 404): check --mig, --project and %s; %s: %w",
				what, loc, other, err)
		case ge.Code == http.StatusUnauthorized:
			return fmt.Errorf("%s: the credentials were refused (HTTP 401): check Application Default "+
				"Credentials (GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth application-default login`, or the VM's "+
				"service account): %w", what, err)
		case ge.Code == http.StatusForbidden && !rateLimited(ge):
			return fmt.Errorf("%s: permission denied (HTTP 403): the credentials need "+
				"compute.instanceGroupManagers.get and compute.instances.list on project %q (e.g. roles/compute.viewer), "+
				"a VM's service account the compute.readonly or cloud-platform scope, and the project the Compute "+
				"Engine API enabled: %w", what, p.cfg.Project, err)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
