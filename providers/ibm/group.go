// Package ibm discovers the hosts of an IBM Cloud VPC instance group: its members' private
// IPs, zones, profiles and availability class, one poll of the VPC API per call.
package ibm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/throttle"
)

// ErrThrottled is wrapped by the errors of polls that the API throttled, or that could not
// wait out an endpoint's backoff before their deadline.
var ErrThrottled = errors.New("throttled by the IBM Cloud VPC API")

// vpcAPI is the part of the VPC SDK the provider uses; *vpcv1.VpcV1 implements it.
type vpcAPI interface {
	ListInstanceGroupsWithContext(context.Context, *vpcv1.ListInstanceGroupsOptions) (*vpcv1.InstanceGroupCollection, *core.DetailedResponse, error)
	ListInstanceGroupMembershipsWithContext(context.Context, *vpcv1.ListInstanceGroupMembershipsOptions) (*vpcv1.InstanceGroupMembershipCollection, *core.DetailedResponse, error)
	ListInstancesWithContext(context.Context, *vpcv1.ListInstancesOptions) (*vpcv1.InstanceCollection, *core.DetailedResponse, error)

	// The capacity calls (capacity.go).
	GetInstanceGroupWithContext(context.Context, *vpcv1.GetInstanceGroupOptions) (*vpcv1.InstanceGroup, *core.DetailedResponse, error)
	UpdateInstanceGroupWithContext(context.Context, *vpcv1.UpdateInstanceGroupOptions) (*vpcv1.InstanceGroup, *core.DetailedResponse, error)
	ListInstanceGroupManagersWithContext(context.Context, *vpcv1.ListInstanceGroupManagersOptions) (*vpcv1.InstanceGroupManagerCollection, *core.DetailedResponse, error)
	UpdateInstanceGroupManagerWithContext(context.Context, *vpcv1.UpdateInstanceGroupManagerOptions) (vpcv1.InstanceGroupManagerIntf, *core.DetailedResponse, error)
	DeleteInstanceGroupMembershipWithContext(context.Context, *vpcv1.DeleteInstanceGroupMembershipOptions) (*core.DetailedResponse, error)
}

// The endpoints, each with its own backoff.
const (
	opGroups      = "list_instance_groups"
	opMemberships = "list_instance_group_memberships"
	opInstances   = "list_instances"
)

const (
	// pageLimit is the largest page the VPC API serves (its limit parameter is 1…100).
	pageLimit = 100
	// maxPages bounds one listing: 100,000 items, far beyond any instance group.
	maxPages = 1000
)

// Provider lists the members of one instance group. It is safe for concurrent use; polls
// that overlap are served one after the other, the later ones from the first one's result.
type Provider struct {
	cfg   Config
	log   *slog.Logger
	api   vpcAPI       // nil when noKey is set
	vpc   *vpcv1.VpcV1 // the same client, for listInstances
	auth  *authProbe   // the api's authenticator
	noKey error        // no credentials: every poll returns it

	// loop is the portable part: one poll at a time, the reuse of a poll's hosts or error
	// within MinInterval, each endpoint's gate (keyed by the op* constants) and retries, the
	// "ibm: " prefix.
	loop *providers.Loop
	// turn is held by the poll or capacity call in progress, which may use the fields below
	// (and auth's last error); a caller waits for it under its own context.
	turn    chan struct{}
	groupID string               // the resolved --instance-group; "" until found, or after it vanished
	leaving map[string]bool      // IDs listed as Leaving by the last good poll, to log each once
	failed  map[string]time.Time // launch failures listed by LaunchFailures, by ID: when first seen
}

// driver is the cloud's own part of the provider, under the loop: its SDK calls.
type driver struct{ p *Provider }

// New checks cfg and makes the provider; it does not touch the network. Credentials come from
// cfg.Authenticator, else the SDK's external configuration for the "vpc" service
// (ibm-credentials.env, VPC_AUTH_TYPE, VPC_APIKEY, VPC_IAM_PROFILE_ID…), else an IAM API key
// in IBMCLOUD_API_KEY or IC_API_KEY. Missing credentials are not an error here: every poll
// reports them, naming the group and the region and saying what to set.
func New(cfg Config) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Provider{cfg: cfg, log: log.With("provider", "ibm"), turn: make(chan struct{}, 1)}
	p.loop = providers.NewLoop(providers.LoopConfig{
		Name: "ibm", Where: func() string { return fmt.Sprintf("instance group %q (%s)", cfg.InstanceGroup, cfg.where()) },
		MinInterval: cfg.MinInterval, KeepErrors: true, Tries: throttle.Tries,
		Gates: throttle.Config{Max: cfg.MaxBackoff, MaxRetryAfter: cfg.MaxBackoff}, Logger: p.log,
	}, driver{p})
	a, err := authenticator(cfg)
	if err != nil {
		p.noKey = err
		return p, nil
	}
	p.auth = &authProbe{Authenticator: a}
	api, err := vpcv1.NewVpcV1(&vpcv1.VpcV1Options{URL: cfg.serviceURL(), Authenticator: p.auth})
	if err != nil {
		return nil, p.loop.Errorf("VPC API client: %v", err)
	}
	p.api, p.vpc = api, api
	return p, nil
}

// Hosts lists the group's members that can run workers or are being taken away:
//   - running instances, with their primary private IP, zone, profile, availability class
//     (spot or standard) and creation time; slots from the GPU table (see slotsFor);
//   - Leaving: true for instances stopping, stopped (stopped_by_preemption among them),
//     restarting, being deleted or failed, and for memberships being deleted or failed;
//   - pending and starting instances, and any without a private IP yet, are left out.
//
// A call sooner than MinInterval after the last one that reached the API returns that one's
// hosts (a fresh copy) or error, without calling the API.
func (p *Provider) Hosts(ctx context.Context) ([]providers.Host, error) {
	return p.loop.Hosts(ctx)
}

// ListHosts is one poll of the API, after any capacity call in progress.
func (d driver) ListHosts(ctx context.Context) ([]providers.Host, error) {
	if !d.p.take(ctx) {
		return nil, fmt.Errorf("waiting for the capacity call in progress: %w", ctx.Err())
	}
	defer d.p.give()
	return d.p.poll(ctx)
}

// take waits for the provider's turn under ctx; false when ctx ended first.
func (p *Provider) take(ctx context.Context) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case p.turn <- struct{}{}:
		if ctx.Err() != nil { // both were ready and select took the turn
			<-p.turn
			return false
		}
		return true
	case <-ctx.Done():
		return false
	}
}

func (p *Provider) give() { <-p.turn }

// errorf makes an error of the provider; the loop prefixes the group and where it is looked
// for ("ibm: instance group "g" (region r): ").
func (p *Provider) errorf(format string, args ...any) error {
	return fmt.Errorf(format, args...)
}

// poll reads the group from the API: the group's ID on the first poll, then its memberships
// and its instances, each listing paged at the largest page size. Calls grow with pages, not
// with instances: no request is made per member.
func (p *Provider) poll(ctx context.Context) ([]providers.Host, error) {
	if p.noKey != nil {
		return nil, p.noKey
	}
	ops := []string{opMemberships, opInstances}
	if p.groupID == "" {
		ops = append(ops, opGroups)
	}
	// A poll that cannot get through every endpoint it needs before its deadline spends no
	// calls at all: a throttled API is not asked again before it said.
	for _, op := range ops {
		if err := p.check(ctx, op, "the "+op+" endpoint"); err != nil {
			return nil, p.errorf("%w", err)
		}
	}
	if p.groupID == "" {
		if err := p.resolve(ctx); err != nil {
			return nil, err
		}
	}
	members, err := p.memberships(ctx)
	if err != nil {
		if statusOf(err) == http.StatusNotFound {
			id := p.groupID
			p.groupID = "" // looked up again, by name, on the next poll
			return nil, p.errorf("the group (ID %s) no longer exists: %v; check --instance-group and --region", id, err)
		}
		return nil, p.errorf("%w", err)
	}
	hosts, why, err := p.instances(ctx, members)
	if err != nil {
		return nil, p.errorf("%w", err)
	}
	slices.SortFunc(hosts, func(a, b providers.Host) int { return strings.Compare(a.ID, b.ID) })
	p.noteLeaving(hosts, why)
	return hosts, nil
}

// resolve finds the group's ID: an exact ID match wins, else a unique name match.
func (p *Provider) resolve(ctx context.Context) error {
	want := p.cfg.InstanceGroup
	var byID string
	var byName []string
	total := 0
	err := p.list(ctx, opGroups, "list instance groups", func(ctx context.Context, start *string) (*string, *core.DetailedResponse, error) {
		res, resp, err := p.api.ListInstanceGroupsWithContext(ctx, &vpcv1.ListInstanceGroupsOptions{Start: start, Limit: core.Int64Ptr(pageLimit)})
		if err != nil {
			return nil, resp, err
		}
		if res == nil || res.InstanceGroups == nil {
			return nil, resp, errors.New("the reply has no instance_groups array")
		}
		for i, g := range res.InstanceGroups {
			total++
			id := str(g.ID)
			if id == "" {
				return nil, resp, fmt.Errorf("instance group %d of the page has no id", i)
			}
			switch {
			case id == want:
				byID = id
			case str(g.Name) == want:
				byName = append(byName, id)
			}
		}
		next, err := res.GetNextStart()
		return next, resp, err
	})
	if err != nil {
		return p.errorf("looking the group up: %w", err)
	}
	switch {
	case byID != "":
		p.groupID = byID
	case len(byName) == 1:
		p.groupID = byName[0]
	case len(byName) > 1:
		return p.errorf("%d instance groups have this name (IDs %s): give --instance-group the ID", len(byName), strings.Join(byName, ", "))
	default:
		return p.errorf("not found among the %d instance groups the credentials can see there: "+
			"check --instance-group (the group's name or ID), --region, and that the API key belongs to the group's account", total)
	}
	p.log.Info("found the instance group", "group", want, "id", p.groupID)
	return nil
}

// membership is what a listing says of one membership.
type membership struct {
	id, name, status string
	created          time.Time // zero when the reply leaves created_at out
	// deletesInstance: deleting the membership deletes its instance too.
	deletesInstance bool
}

// memberships maps the group's member instance IDs to their memberships.
func (p *Provider) memberships(ctx context.Context) (map[string]membership, error) {
	members := make(map[string]membership)
	err := p.list(ctx, opMemberships, "list the group's memberships", func(ctx context.Context, start *string) (*string, *core.DetailedResponse, error) {
		opts := &vpcv1.ListInstanceGroupMembershipsOptions{InstanceGroupID: &p.groupID, Start: start, Limit: core.Int64Ptr(pageLimit)}
		res, resp, err := p.api.ListInstanceGroupMembershipsWithContext(ctx, opts)
		if err != nil {
			return nil, resp, err
		}
		if res == nil || res.Memberships == nil {
			return nil, resp, errors.New("the reply has no memberships array")
		}
		for i, m := range res.Memberships {
			id := ""
			if m.Instance != nil {
				id = str(m.Instance.ID)
			}
			switch {
			case id == "":
				return nil, resp, fmt.Errorf("membership %d of the page (%s) has no instance.id", i, str(m.ID))
			case str(m.Status) == "":
				return nil, resp, fmt.Errorf("the membership of instance %s has no status", id)
			}
			ms := membership{id: str(m.ID), name: str(m.Name), status: *m.Status,
				deletesInstance: m.DeleteInstanceOnMembershipDelete == nil || *m.DeleteInstanceOnMembershipDelete}
			if m.CreatedAt != nil {
				ms.created = time.Time(*m.CreatedAt)
			}
			members[id] = ms
		}
		next, err := res.GetNextStart()
		return next, resp, err
	})
	return members, err
}

// instances lists the instances of the group (the API filters them by the group) and joins
// them with the memberships; why says why each leaving host is leaving.
func (p *Provider) instances(ctx context.Context, members map[string]membership) (hosts []providers.Host, why map[string]string, err error) {
	hosts = make([]providers.Host, 0, len(members))
	why = make(map[string]string)
	// An instance listed on two pages (the group changed while it was paged) is kept once.
	seen := make(map[string]bool, len(members))
	err = p.list(ctx, opInstances, "list the group's instances", func(ctx context.Context, start *string) (*string, *core.DetailedResponse, error) {
		list, next, resp, err := p.listInstances(ctx, start)
		if err != nil {
			return nil, resp, err
		}
		for i := range list {
			in := list[i].instance()
			h, ok, err := p.host(in, members)
			if err != nil {
				return nil, resp, err
			}
			if ok && !seen[h.ID] {
				seen[h.ID] = true
				hosts = append(hosts, h)
				if h.Leaving {
					why[h.ID] = leavingWhy(in, members[h.ID].status)
				}
			}
		}
		return next, resp, nil
	})
	return hosts, why, err
}

// host turns one instance into a host; ok is false for an instance left out (not of this
// group, not started yet, no private IP yet).
func (p *Provider) host(in *vpcv1.Instance, members map[string]membership) (h providers.Host, ok bool, err error) {
	id := str(in.ID)
	if id == "" {
		return h, false, errors.New("an instance has no id")
	}
	m, listed := members[id]
	member := m.status
	if !listed && !inGroup(in, p.groupID) {
		return h, false, nil // the API ignored the filter, or the member left between the listings
	}
	status := str(in.Status)
	switch {
	case status == "":
		return h, false, fmt.Errorf("instance %s has no status", id)
	case in.Zone == nil || str(in.Zone.Name) == "":
		return h, false, fmt.Errorf("instance %s has no zone.name", id)
	case in.Profile == nil || str(in.Profile.Name) == "":
		return h, false, fmt.Errorf("instance %s has no profile.name", id)
	case in.CreatedAt == nil:
		return h, false, fmt.Errorf("instance %s has no created_at", id)
	}
	if status == vpcv1.InstanceStatusPendingConst || status == vpcv1.InstanceStatusStartingConst {
		return h, false, nil // not offered before it runs, whatever else is said of it
	}
	leaving := leavingStatus[status] || leavingLifecycle[str(in.LifecycleState)] || leavingMembership[member]
	if !leaving && status != vpcv1.InstanceStatusRunningConst {
		return h, false, nil // a status this code does not know
	}
	addr, err := primaryIP(in)
	if err != nil {
		return h, false, fmt.Errorf("instance %s: %w", id, err)
	}
	if !addr.IsValid() {
		return h, false, nil
	}
	profile := *in.Profile.Name
	return providers.Host{
		ID:       id,
		Addr:     addr.String(),
		Slots:    slotsFor(profile, in.Gpu, p.cfg.SlotsPerHost),
		Zone:     *in.Zone.Name,
		Spot:     in.Availability != nil && str(in.Availability.Class) == vpcv1.InstanceAvailabilityClassSpotConst,
		Type:     profile,
		Launched: time.Time(*in.CreatedAt),
		Leaving:  leaving,
	}, true, nil
}

// What counts as leaving: the cloud is stopping, rebooting or deleting the instance, or the
// group is removing it. A spot instance the cloud reclaimed shows as stopped with the reason
// stopped_by_preemption (or, with the delete preemption policy, deleting, then gone).
var (
	leavingStatus = map[string]bool{
		vpcv1.InstanceStatusStoppingConst:   true,
		vpcv1.InstanceStatusStoppedConst:    true,
		vpcv1.InstanceStatusRestartingConst: true,
		vpcv1.InstanceStatusDeletingConst:   true,
		vpcv1.InstanceStatusFailedConst:     true,
	}
	leavingLifecycle = map[string]bool{
		vpcv1.InstanceLifecycleStateDeletingConst:  true,
		vpcv1.InstanceLifecycleStateFailedConst:    true,
		vpcv1.InstanceLifecycleStateSuspendedConst: true,
	}
	leavingMembership = map[string]bool{
		vpcv1.InstanceGroupMembershipStatusDeletingConst: true,
		vpcv1.InstanceGroupMembershipStatusFailedConst:   true,
	}
)

// inGroup reports whether the instance says it is a member of the group.
func inGroup(in *vpcv1.Instance, groupID string) bool {
	m := in.InstanceGroupMembership
	return m != nil && m.InstanceGroup != nil && str(m.InstanceGroup.ID) == groupID
}

// primaryIP is the instance's primary private IP, from its primary network attachment or,
// on instances made with network interfaces, its primary network interface. The zero Addr
// means none yet: the API says 0.0.0.0 until an address is picked.
func primaryIP(in *vpcv1.Instance) (netip.Addr, error) {
	var s string
	switch {
	case in.PrimaryNetworkAttachment != nil && in.PrimaryNetworkAttachment.PrimaryIP != nil:
		s = str(in.PrimaryNetworkAttachment.PrimaryIP.Address)
	case in.PrimaryNetworkInterface != nil && in.PrimaryNetworkInterface.PrimaryIP != nil:
		s = str(in.PrimaryNetworkInterface.PrimaryIP.Address)
	}
	if s == "" || s == "0.0.0.0" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" || a.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("primary IP %q is not an IP address", s)
	}
	return a, nil
}

// leavingWhy says what the API says of a leaving instance: its status and status reasons
// (stopped_by_preemption: a spot reclaim), its lifecycle state, its membership's status.
func leavingWhy(in *vpcv1.Instance, member string) string {
	var b strings.Builder
	b.WriteString("status " + str(in.Status))
	for _, r := range in.StatusReasons {
		b.WriteString(" " + str(r.Code))
	}
	if ls := str(in.LifecycleState); leavingLifecycle[ls] {
		b.WriteString(", lifecycle " + ls)
	}
	if member != "" {
		b.WriteString(", membership " + member)
	}
	return b.String()
}

// noteLeaving logs each host the first time a poll lists it as leaving: with no notice from
// IBM, this line is where a preemption shows.
func (p *Provider) noteLeaving(hosts []providers.Host, why map[string]string) {
	now := make(map[string]bool)
	for _, h := range hosts {
		if !h.Leaving {
			continue
		}
		now[h.ID] = true
		if !p.leaving[h.ID] {
			p.log.Info("instance is leaving the group", "host", h.ID, "addr", h.Addr, "spot", h.Spot, "why", why[h.ID])
		}
	}
	p.leaving = now
}

// pageFunc fetches one page starting at start (nil: the first) and returns the next page's
// start, nil after the last.
type pageFunc func(ctx context.Context, start *string) (next *string, resp *core.DetailedResponse, err error)

// list walks every page of a listing, at most maxPages, and stops on a start token that
// comes back twice rather than loop.
func (p *Provider) list(ctx context.Context, op, what string, page pageFunc) error {
	var start *string
	seen := make(map[string]bool)
	for n := 1; n <= maxPages; n++ {
		var next *string
		desc := what
		if n > 1 {
			desc = fmt.Sprintf("%s (page %d)", what, n)
		}
		err := p.call(ctx, op, desc, func() (resp *core.DetailedResponse, err error) {
			next, resp, err = page(ctx, start)
			return resp, err
		})
		switch {
		case err != nil:
			return err
		case next == nil:
			return nil
		case *next == "" || seen[*next]:
			return fmt.Errorf("%s: the reply's next page starts at %q again; stopping rather than loop", desc, *next)
		}
		seen[*next] = true
		start = next
	}
	return fmt.Errorf("%s: more than %d pages of %d; stopping", what, maxPages, pageLimit)
}

// httpError is an API reply with an error status.
type httpError struct {
	status int
	msg    string
	hint   string
}

func (e *httpError) Error() string {
	s := fmt.Sprintf("HTTP %d %s: %s", e.status, http.StatusText(e.status), strings.TrimSuffix(e.msg, "."))
	if e.hint != "" {
		s += "; " + e.hint
	}
	return s
}

// statusOf is the HTTP status of an API error, 0 if err is not one.
func statusOf(err error) int {
	var he *httpError
	if errors.As(err, &he) {
		return he.status
	}
	return 0
}

// reqError is one failed request as call sees it: the error, the response (nil when none
// came) and whether getting the IAM token failed.
type reqError struct {
	err  error
	resp *core.DetailedResponse
	auth error
}

// Error reads as the gate's reason for resting: the status, then what the API said.
func (e *reqError) Error() string {
	if s := e.status(); s != 0 {
		return fmt.Sprintf("HTTP %d %s: %v", s, http.StatusText(s), e.err)
	}
	return e.err.Error()
}
func (e *reqError) Unwrap() error { return e.err }

func (e *reqError) status() int {
	if e.resp == nil {
		return 0
	}
	return e.resp.StatusCode
}

// Classify: a throttled request (429, 503) rests the endpoint and is retried, waiting what
// the server asked; so is a conflict (409: a capacity call that found the group busy, its
// status scaling or another change of it in progress, which passes); a server error or a
// failed connection rests it but is not retried (the next poll is); anything else (a failed
// IAM token, a refused request) neither.
func (d driver) Classify(err error) providers.Verdict {
	var re *reqError
	if !errors.As(err, &re) || re.auth != nil {
		return providers.Permanent
	}
	switch status := re.status(); {
	case throttled(status), status == http.StatusConflict:
		return providers.Verdict{Rest: true, Retry: true, After: retryAfter(re.resp, time.Now())}
	case status == 0 || status >= 500:
		return providers.Verdict{Rest: true, After: retryAfter(re.resp, time.Now())}
	}
	return providers.Permanent
}

// call makes one request of endpoint op through the loop (providers.Loop.Call): it waits out
// the endpoint's backoff when that fits the poll's deadline, and retries a throttled request
// (throttle.Tries requests in all), waiting what the server asked. Other failures are
// returned at once: polls are retried by the discovery watcher, not here.
func (p *Provider) call(ctx context.Context, op, what string, do func() (*core.DetailedResponse, error)) error {
	if err := p.request(ctx, op, do); err != nil {
		return p.explain(ctx, op, what, err)
	}
	return nil
}

// request is call's request through the loop; a failure as the loop returns it, around a
// *reqError when the request was made.
func (p *Provider) request(ctx context.Context, op string, do func() (*core.DetailedResponse, error)) error {
	return p.loop.Call(ctx, op, func(context.Context) error {
		if p.auth != nil {
			p.auth.err = nil
		}
		resp, err := do()
		if err == nil {
			return nil
		}
		re := &reqError{err: err, resp: resp}
		if p.auth != nil {
			re.auth = p.auth.err
		}
		return re
	})
}

// explain is the error of request's failure err: what was asked (what), then what went wrong
// and, for the statuses that mean the setup is wrong, what to fix.
func (p *Provider) explain(ctx context.Context, op, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%s: %w", what, cerr)
	}
	var te *throttle.Error
	if errors.As(err, &te) {
		return backsOff(what, te)
	}
	tries := 1
	if rt := (*providers.RetryError)(nil); errors.As(err, &rt) {
		tries = rt.Tries
	}
	var re *reqError
	if !errors.As(err, &re) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if re.auth != nil {
		return fmt.Errorf("%s: getting an IAM token: %s; check the API key (IBMCLOUD_API_KEY, VPC_APIKEY) or the trusted profile",
			what, strings.TrimSuffix(re.auth.Error(), "."))
	}
	status := re.status()
	switch {
	case throttled(status):
		why := fmt.Sprintf("HTTP %d %s: %v", status, http.StatusText(status), re.err)
		return fmt.Errorf("%s: %w %d times in a row (last %s); not before %s", what, ErrThrottled, tries, why, p.loop.Until(op).Format(time.RFC3339))
	case status == 0:
		return fmt.Errorf("%s: %v", what, re.err)
	case status >= 500:
		return fmt.Errorf("%s: HTTP %d %s: %v", what, status, http.StatusText(status), re.err)
	case status >= 200 && status < 300:
		return fmt.Errorf("%s: malformed reply: %v", what, re.err)
	case tries > 1:
		return fmt.Errorf("%s: %d tries, the last: %w", what, tries, &httpError{status: status, msg: re.err.Error(), hint: hints[status]})
	default:
		return fmt.Errorf("%s: %w", what, &httpError{status: status, msg: re.err.Error(), hint: hints[status]})
	}
}

// hints say what to fix for the statuses that mean the setup is wrong.
var hints = map[int]string{
	http.StatusUnauthorized: "the credentials were refused: check the API key (IBMCLOUD_API_KEY, VPC_APIKEY) or the trusted profile",
	http.StatusForbidden:    "the credentials may not read this: grant the Viewer role on VPC Infrastructure Services (instance groups and virtual server instances)",
	http.StatusConflict:     "the instance group is busy (scaling, or another change of it in progress); a later call may succeed",
}

// check fails, without waiting, when endpoint op is backing off past the poll's deadline.
func (p *Provider) check(ctx context.Context, op, what string) error {
	if te := (*throttle.Error)(nil); errors.As(p.loop.Ready(ctx, op), &te) {
		return backsOff(what, te)
	}
	return nil
}

// backsOff is the error of a call not made because its endpoint backs off too long.
func backsOff(what string, te *throttle.Error) error {
	return fmt.Errorf("%s: %w: the endpoint backs off until %s (after %v), past this poll's deadline",
		what, ErrThrottled, te.Until.Format(time.RFC3339), te.Cause)
}

// authProbe tells a failed token request (a wrong API key, IAM unreachable) from an API error:
// the SDK reports both as a failed request. Requests are made one at a time (one poll at a
// time, under the loop), so err needs no lock.
type authProbe struct {
	core.Authenticator
	err error
}

func (a *authProbe) Authenticate(r *http.Request) error {
	a.err = a.Authenticator.Authenticate(r)
	return a.err
}

func str(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
