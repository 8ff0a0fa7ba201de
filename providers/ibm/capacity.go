package ibm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"
	"github.com/elasticd/elasticd/providers"
)

// Steering the group (providers.Capacity). Its desired size is the instance group's
// membership_count; an enabled autoscale manager bounds it (min_membership_count,
// max_membership_count) and sets it by itself. IBM's documentation (the Terraform provider's
// ibm_is_instance_group: "instance group manager should be in disabled state to update the
// instance_count") has the manager disabled before membership_count is set, so SetDesired
// disables it first and leaves it disabled: elasticd then holds the group's size.

// The capacity endpoints, each with its own gate like the polls' (group.go).
const (
	opGroup            = "get_instance_group"
	opManagers         = "list_instance_group_managers"
	opUpdateGroup      = "update_instance_group"
	opUpdateManager    = "update_instance_group_manager"
	opDeleteMembership = "delete_instance_group_membership"
)

// maxMembershipCount bounds membership_count in the VPC API reference (0 to 1000; the
// Terraform provider checks instance_count against the same range): the group's maximum when
// no enabled autoscale manager sets a lower one.
const maxMembershipCount = 1000

// What a refused change needs. IBM's IAM table for Auto Scale for VPC (service
// is.instance-group) has one action for changing a group, held by the Editor and
// Administrator platform roles; its managers and memberships have no actions of their own
// there (Activity Tracker names is.instance-group.manager.update and
// is.instance-group.membership.delete as events, not as IAM actions).
const (
	needsUpdate = "the Editor role on the instance group, IAM action is.instance-group.instance-group.update"
	// Deleting a membership also deletes its instance (delete_instance_on_membership_delete,
	// true for the members the group makes); whether IBM checks the caller's access to the
	// instance too is not documented, so the text names both.
	needsDelete = "the Editor role on the instance group, IAM action is.instance-group.instance-group.update, and on its virtual server instances"
	// needsCredentials: 401, a token IBM did not accept.
	needsCredentials = "credentials IBM accepts: check the API key (IBMCLOUD_API_KEY, VPC_APIKEY) or the trusted profile"
)

var _ providers.Capacity = (*Provider)(nil)

// steer runs one capacity call fn after the poll or capacity call in progress, with the
// group's ID resolved, and prefixes its error as a poll's ("ibm: instance group …: ").
func (p *Provider) steer(ctx context.Context, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return p.loop.Errorf("%w", err)
	}
	if !p.take(ctx) {
		return p.loop.Errorf("waiting for the poll or capacity call in progress: %w", ctx.Err())
	}
	defer p.give()
	if p.noKey != nil {
		return p.loop.Errorf("%w", p.noKey)
	}
	if p.groupID == "" {
		if err := p.resolve(ctx); err != nil {
			return p.loop.Errorf("%w", err)
		}
	}
	if err := fn(); err != nil {
		return p.loop.Errorf("%w", err)
	}
	return nil
}

// groupGone turns a 404 on the group into an error that says so, and makes the next call
// look the group up again by name.
func (p *Provider) groupGone(err error) error {
	if statusOf(err) != http.StatusNotFound {
		return err
	}
	id := p.groupID
	p.groupID = ""
	return fmt.Errorf("the group (ID %s) no longer exists: %w; check --instance-group and --region", id, err)
}

// manager is what the provider reads of an instance group manager.
type manager struct {
	id, name, kind string // kind: autoscale or scheduled
	enabled        bool
	min, max       int // autoscale only
}

// groupState is one read of the group and its managers.
type groupState struct {
	desired int
	status  string
	// scaler is the enabled autoscale manager, nil when none; scheduled names an enabled
	// scheduled manager (whose actions set membership_count, or the autoscale manager's
	// bounds, at their times), "" when none.
	scaler    *manager
	scheduled string
}

// size is the GroupSize the state says, less Instances.
func (g groupState) size() providers.GroupSize {
	s := providers.GroupSize{Desired: g.desired, Max: maxMembershipCount}
	switch {
	case g.scaler != nil:
		s.Min, s.Max = g.scaler.min, g.scaler.max
		s.Autoscaled = fmt.Sprintf("the instance group's autoscale manager %q", g.scaler.name)
	case g.scheduled != "":
		s.Autoscaled = fmt.Sprintf("the instance group's scheduled manager %q", g.scheduled)
	}
	return s
}

// readGroup gets the group (GET /instance_groups/{id}) and lists its managers
// (GET /instance_groups/{id}/managers).
func (p *Provider) readGroup(ctx context.Context) (groupState, error) {
	var g groupState
	err := p.call(ctx, opGroup, "get the instance group", func() (*core.DetailedResponse, error) {
		ig, resp, err := p.api.GetInstanceGroupWithContext(ctx, &vpcv1.GetInstanceGroupOptions{ID: &p.groupID})
		switch {
		case err != nil:
			return resp, err
		case ig == nil || ig.MembershipCount == nil:
			return resp, errors.New("the reply has no membership_count")
		}
		g.desired, g.status = int(*ig.MembershipCount), str(ig.Status)
		return resp, nil
	})
	if err != nil {
		return g, p.groupGone(err)
	}
	err = p.list(ctx, opManagers, "list the group's managers", func(ctx context.Context, start *string) (*string, *core.DetailedResponse, error) {
		opts := &vpcv1.ListInstanceGroupManagersOptions{InstanceGroupID: &p.groupID, Start: start, Limit: core.Int64Ptr(pageLimit)}
		res, resp, err := p.api.ListInstanceGroupManagersWithContext(ctx, opts)
		if err != nil {
			return nil, resp, err
		}
		if res == nil || res.Managers == nil {
			return nil, resp, errors.New("the reply has no managers array")
		}
		for i, mi := range res.Managers {
			m, err := managerOf(mi)
			if err != nil {
				return nil, resp, fmt.Errorf("manager %d of the page: %w", i, err)
			}
			switch {
			case !m.enabled:
			case m.kind == vpcv1.InstanceGroupManagerManagerTypeAutoscaleConst && g.scaler == nil:
				g.scaler = &m
			case m.kind == "scheduled" && g.scheduled == "":
				g.scheduled = m.name
			}
		}
		next, err := res.GetNextStart()
		return next, resp, err
	})
	if err != nil {
		return g, p.groupGone(err)
	}
	return g, nil
}

// managerOf reads one manager of a listing: the SDK decodes them all as
// *vpcv1.InstanceGroupManager, whatever their manager_type.
func managerOf(mi vpcv1.InstanceGroupManagerIntf) (manager, error) {
	var (
		id, name, kind *string
		enabled        *bool
		min, max       *int64
	)
	switch m := mi.(type) {
	case *vpcv1.InstanceGroupManager:
		id, name, kind, enabled, min, max = m.ID, m.Name, m.ManagerType, m.ManagementEnabled, m.MinMembershipCount, m.MaxMembershipCount
	case *vpcv1.InstanceGroupManagerAutoScale:
		id, name, kind, enabled, min, max = m.ID, m.Name, m.ManagerType, m.ManagementEnabled, m.MinMembershipCount, m.MaxMembershipCount
	case *vpcv1.InstanceGroupManagerScheduled:
		id, name, kind, enabled = m.ID, m.Name, m.ManagerType, m.ManagementEnabled
	default:
		return manager{}, fmt.Errorf("a manager of type %T", mi)
	}
	out := manager{id: str(id), name: str(name), kind: str(kind)}
	switch {
	case out.id == "":
		return out, errors.New("no id")
	case enabled == nil:
		return out, fmt.Errorf("manager %s has no management_enabled", out.id)
	}
	out.enabled = *enabled
	if out.kind == vpcv1.InstanceGroupManagerManagerTypeAutoscaleConst {
		if max == nil {
			return out, fmt.Errorf("autoscale manager %s has no max_membership_count", out.id)
		}
		out.max = int(*max)
		if min != nil {
			out.min = int(*min)
		}
	}
	return out, nil
}

// GroupSize reads the group: Desired is its membership_count; Min and Max its enabled
// autoscale manager's min_membership_count and max_membership_count, else 0 and the API's
// bound on membership_count (1000); Instances the memberships listed, in any status.
func (p *Provider) GroupSize(ctx context.Context) (providers.GroupSize, error) {
	var s providers.GroupSize
	err := p.steer(ctx, func() error {
		g, err := p.readGroup(ctx)
		if err != nil {
			return err
		}
		members, err := p.memberships(ctx)
		if err != nil {
			return p.groupGone(err)
		}
		s = g.size()
		s.Instances = len(members)
		return nil
	})
	return s, err
}

// SetDesired sets the group's membership_count to n (PATCH /instance_groups/{id}). An
// enabled autoscale manager is disabled first (PATCH …/managers/{id}, management_enabled
// false), as IBM requires, and stays disabled; a disabled one is left alone. n above the
// maximum is refused without a request.
func (p *Provider) SetDesired(ctx context.Context, n int) error {
	if n < 0 {
		return p.loop.Errorf("set membership_count to %d: a group's size cannot be negative", n)
	}
	return p.steer(ctx, func() error {
		g, err := p.readGroup(ctx)
		if err != nil {
			return err
		}
		if max := g.size().Max; n > max {
			why := "the API's limit on membership_count"
			if g.scaler != nil {
				why = fmt.Sprintf("max_membership_count of the autoscale manager %q", g.scaler.name)
			}
			return fmt.Errorf("set membership_count to %d: %w (%d, %s)", n, providers.ErrAboveMax, max, why)
		}
		if m := g.scaler; m != nil {
			patch, err := (&vpcv1.InstanceGroupManagerPatch{ManagementEnabled: core.BoolPtr(false)}).AsPatch()
			if err != nil {
				return fmt.Errorf("the manager patch: %v", err)
			}
			what := fmt.Sprintf("disable the autoscale manager %q (so that membership_count may be set)", m.name)
			err = p.mutate(ctx, opUpdateManager, what, needsUpdate, func() (*core.DetailedResponse, error) {
				_, resp, err := p.api.UpdateInstanceGroupManagerWithContext(ctx, &vpcv1.UpdateInstanceGroupManagerOptions{
					InstanceGroupID: &p.groupID, ID: &m.id, InstanceGroupManagerPatch: patch,
				})
				return resp, err
			})
			if err != nil {
				return err
			}
			p.log.Info("disabled the instance group's autoscale manager: elasticd now sets the group's size",
				"manager", m.name, "min", m.min, "max", m.max, "desired", g.desired)
		}
		patch, err := (&vpcv1.InstanceGroupPatch{MembershipCount: core.Int64Ptr(int64(n))}).AsPatch()
		if err != nil {
			return fmt.Errorf("the group patch: %v", err)
		}
		what := fmt.Sprintf("set membership_count to %d (from %d)", n, g.desired)
		err = p.mutate(ctx, opUpdateGroup, what, needsUpdate, func() (*core.DetailedResponse, error) {
			_, resp, err := p.api.UpdateInstanceGroupWithContext(ctx, &vpcv1.UpdateInstanceGroupOptions{ID: &p.groupID, InstanceGroupPatch: patch})
			return resp, err
		})
		if err != nil {
			err = p.groupGone(err)
			if g.scaler != nil {
				return fmt.Errorf("%w (the autoscale manager %q was disabled and stays so)", err, g.scaler.name)
			}
			return err
		}
		p.loop.Forget()
		return nil
	})
}

// Replace deletes the membership of instance hostID (DELETE
// /instance_groups/{id}/memberships/{membership_id}), leaving membership_count as it was.
//
// That the group then launches a replacement is marked unconfirmed [U] in our notes
// (capacity.md). What IBM documents: deleting a membership cannot be reversed and, with
// delete_instance_on_membership_delete (true for the members the group creates), deletes
// the instance too; the group's status is "scaling" while "instances are being created or
// deleted to reach membership_count" and "healthy" once it "has membership_count
// instances". So a group short of membership_count creates a member, which is the
// replacement; a group whose manager is enabled may instead scale within its bounds.
func (p *Provider) Replace(ctx context.Context, hostID string) error {
	return p.steer(ctx, func() error {
		members, err := p.memberships(ctx)
		if err != nil {
			return p.groupGone(err)
		}
		m, ok := members[hostID]
		switch {
		case !ok:
			return fmt.Errorf("replace instance %s: %w (no membership of the group lists it)", hostID, providers.ErrNotInGroup)
		case m.status == vpcv1.InstanceGroupMembershipStatusDeletingConst:
			return fmt.Errorf("replace instance %s: %w (its membership %s is already being deleted)", hostID, providers.ErrNotInGroup, m.id)
		case m.id == "":
			return fmt.Errorf("replace instance %s: its membership has no id", hostID)
		}
		if !m.deletesInstance {
			p.log.Warn("the membership does not delete its instance: the instance leaves the group but keeps running (and costing)",
				"host", hostID, "membership", m.id)
		}
		what := fmt.Sprintf("delete the membership %s of instance %s", m.id, hostID)
		err = p.mutate(ctx, opDeleteMembership, what, needsDelete, func() (*core.DetailedResponse, error) {
			return p.api.DeleteInstanceGroupMembershipWithContext(ctx, &vpcv1.DeleteInstanceGroupMembershipOptions{InstanceGroupID: &p.groupID, ID: &m.id})
		})
		if statusOf(err) == http.StatusNotFound {
			return fmt.Errorf("replace instance %s: %w (%v)", hostID, providers.ErrNotInGroup, err)
		}
		if err != nil {
			return err
		}
		p.log.Info("deleted the membership of an instance: the group launches a replacement", "host", hostID, "membership", m.id)
		p.loop.Forget()
		return nil
	})
}

// LaunchFailures lists the memberships whose status is failed ("unable to maintain dependent
// resources") with their instances' status reasons: each reason is one failure, whose ID is
// the membership's ID and the reason's code (cannot_start_capacity: no capacity of the
// profile, spot or not, in the zone). A failed membership whose instance gives no reason
// (gone, or none listed) is one failure without a code. At is the membership's created_at,
// else the instance's, else when this provider first listed it. Only when some membership
// failed are the group's instances listed.
func (p *Provider) LaunchFailures(ctx context.Context) ([]providers.LaunchFailure, error) {
	var out []providers.LaunchFailure
	err := p.steer(ctx, func() error {
		members, err := p.memberships(ctx)
		if err != nil {
			return p.groupGone(err)
		}
		failed := make(map[string]membership)
		for id, m := range members {
			if m.status == vpcv1.InstanceGroupMembershipStatusFailedConst {
				failed[id] = m
			}
		}
		if len(failed) == 0 {
			p.failed = nil
			return nil
		}
		ins, err := p.failedInstances(ctx, failed)
		if err != nil {
			return err
		}
		now := time.Now()
		seen := make(map[string]time.Time)
		for id, m := range failed {
			in := ins[id]
			at, zone := m.created, ""
			if in != nil {
				if at.IsZero() && in.CreatedAt != nil {
					at = time.Time(*in.CreatedAt)
				}
				if in.Zone != nil {
					zone = str(in.Zone.Name)
				}
			}
			add := func(f providers.LaunchFailure) {
				f.At, f.Zone = at, zone
				if f.At.IsZero() {
					f.At = cmp.Or(p.failed[f.ID], now)
					seen[f.ID] = f.At
				}
				f.Kind = providers.Classify(f.Code, f.Message)
				out = append(out, f)
			}
			n := len(out)
			if in != nil {
				for _, r := range in.StatusReasons {
					if code := str(r.Code); code != "" {
						add(providers.LaunchFailure{ID: m.id + "/" + code, Code: code, Message: str(r.Message)})
					}
				}
			}
			if len(out) == n {
				status := "not listed"
				if in != nil {
					status = "status " + str(in.Status)
				}
				add(providers.LaunchFailure{ID: m.id, Message: fmt.Sprintf("membership %s failed (instance %s: %s, no status reason)", m.name, id, status)})
			}
		}
		p.failed = seen
		slices.SortFunc(out, func(a, b providers.LaunchFailure) int {
			return cmp.Or(a.At.Compare(b.At), strings.Compare(a.ID, b.ID))
		})
		return nil
	})
	return out, err
}

// failedInstances lists the group's instances (the polls' listing) and keeps those of the
// failed memberships, by instance ID.
func (p *Provider) failedInstances(ctx context.Context, failed map[string]membership) (map[string]*vpcv1.Instance, error) {
	out := make(map[string]*vpcv1.Instance, len(failed))
	err := p.list(ctx, opInstances, "list the group's instances", func(ctx context.Context, start *string) (*string, *core.DetailedResponse, error) {
		list, next, resp, err := p.listInstances(ctx, start)
		if err != nil {
			return nil, resp, err
		}
		for i := range list {
			if id := str(list[i].ID); id != "" {
				if _, ok := failed[id]; ok {
					out[id] = list[i].instance()
				}
			}
		}
		return next, resp, nil
	})
	return out, err
}

// mutate makes one request that changes the group, through the loop like the polls' (a
// conflict, 409, is retried there: see Classify). A refusal wraps providers.ErrRefused and
// says what it needs: a denied permission (403) needs, an unaccepted token (401) needs
// valid credentials, and a 400 that names membership_count (out of range, or refused while
// an autoscale manager is enabled) a count the group takes.
func (p *Provider) mutate(ctx context.Context, op, what, needs string, do func() (*core.DetailedResponse, error)) error {
	err := p.request(ctx, op, do)
	if err == nil {
		return nil
	}
	var re *reqError
	if ctx.Err() == nil && errors.As(err, &re) && re.auth == nil {
		status := re.status()
		he := &httpError{status: status, msg: re.err.Error()}
		switch {
		case status == http.StatusForbidden:
			return providers.Refused(what, needs, he)
		case status == http.StatusUnauthorized:
			return providers.Refused(what, needsCredentials, he)
		case status == http.StatusBadRequest && namesField(re, "membership_count"):
			return providers.Refused(what, fmt.Sprintf("membership_count between 0 and %d, with no autoscale manager of the group enabled", maxMembershipCount), he)
		}
	}
	return p.explain(ctx, op, what, err)
}

// namesField reports whether an API error names field: as an error's target, or in its
// message. The VPC API's errors are {"errors":[{"code","message","more_info","target":
// {"name","type":"field"}}],"trace","status_code"}; the SDK keeps the decoded body as the
// response's Result.
func namesField(re *reqError, field string) bool {
	if strings.Contains(re.err.Error(), field) {
		return true
	}
	if re.resp == nil {
		return false
	}
	body, _ := re.resp.Result.(map[string]any)
	errs, _ := body["errors"].([]any)
	for _, e := range errs {
		e, _ := e.(map[string]any)
		msg, _ := e["message"].(string)
		target, _ := e["target"].(map[string]any)
		name, _ := target["name"].(string)
		if name == field || strings.Contains(msg, field) {
			return true
		}
	}
	return false
}
