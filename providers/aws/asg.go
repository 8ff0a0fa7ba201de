package aws

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	asgtypes "github.com/aws/aws-sdk-go-v2/service/autoscaling/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/elasticd/elasticd/providers"
)

const (
	// asgPageSize is DescribeAutoScalingGroups' largest page (of groups; a group's instances
	// come whole, inside it).
	asgPageSize = 100
	// ec2PageSize is DescribeInstances' largest page: 10,000 instances are 10 calls.
	ec2PageSize = 1000
	// maxPages bounds every pagination loop: a thousand pages is far beyond any group, and a
	// server that keeps answering with new tokens is broken.
	maxPages = 1000
	// groupTag is the tag Auto Scaling puts on every instance it launches or attaches.
	groupTag = "aws:autoscaling:groupName"
)

// errGroupNotFound is the group's absence: wrong name, wrong region, or deleted.
var errGroupNotFound = errors.New("not found")

// candidate is an instance the group lists as in service or leaving.
type candidate struct {
	in        asgtypes.Instance
	inService bool // its lifecycle state is InService
	leaving   bool
}

// discover is one poll: the group's instances, then EC2's view of them. It returns the hosts
// in the group's order and the IDs of every instance of the group, whatever its state.
func (p *Provider) discover(ctx context.Context) ([]providers.Host, map[string]bool, error) {
	if err := p.clients(ctx); err != nil {
		return nil, nil, err
	}
	group, err := p.describeGroup(ctx)
	if err != nil {
		return nil, nil, err
	}
	deleting := strings.EqualFold(awssdk.ToString(group.Status), "Delete in progress")
	members := make(map[string]bool, len(group.Instances))
	wanted := make(map[string]candidate, len(group.Instances))
	order := make([]string, 0, len(group.Instances))
	for _, in := range group.Instances {
		id := awssdk.ToString(in.InstanceId)
		if id == "" {
			p.log.Warn("the group lists an instance without an ID; skipped")
			continue
		}
		if members[id] {
			continue
		}
		members[id] = true
		state := string(in.LifecycleState)
		switch {
		case state == string(asgtypes.LifecycleStateInService):
			wanted[id] = candidate{in: in, inService: true, leaving: deleting}
		case leavingState(state):
			wanted[id] = candidate{in: in, leaving: true}
		default:
			p.log.Debug("instance not in service; skipped", "host", id, "lifecycle", state)
			continue
		}
		order = append(order, id)
	}
	if len(wanted) == 0 {
		return []providers.Host{}, members, nil
	}
	described, err := p.describeInstances(ctx, wanted)
	if err != nil {
		return nil, nil, err
	}
	inService, seen := 0, 0
	for id, c := range wanted {
		if c.inService {
			inService++
			if _, ok := described[id]; ok {
				seen++
			}
		}
	}
	if inService > 0 && seen == 0 {
		// An in-service instance has been running for a while: EC2 knows it. Knowing none of
		// them means the answer is not EC2's (a proxy's page) or the tag filter is broken, and
		// an empty group would make the driver drop every host. (Leaving instances may well
		// be gone already.)
		return nil, nil, fmt.Errorf("describe instances: EC2 describes none of the group's %d in-service instances", inService)
	}
	hosts := make([]providers.Host, 0, len(order))
	for _, id := range order {
		c := wanted[id]
		inst, ok := described[id]
		if !ok {
			p.log.Debug("instance not (yet) visible in EC2; skipped", "host", id)
			continue
		}
		if h, ok := p.host(id, c, inst); ok {
			hosts = append(hosts, h)
		}
	}
	return hosts, members, nil
}

// leavingState: the group is taking the instance out (scale-in, replacement, detach, standby).
func leavingState(s string) bool {
	return strings.HasPrefix(s, "Terminating") || strings.HasPrefix(s, "ReplacingRootVolume") ||
		s == string(asgtypes.LifecycleStateDetaching) || s == string(asgtypes.LifecycleStateEnteringStandby)
}

// ec2View is what the provider keeps of EC2's description of an instance (a full
// ec2types.Instance is a kilobyte; a group may have thousands).
type ec2View struct {
	state         ec2types.InstanceStateName
	ip, zone, typ string
	spot          bool
	launched      time.Time
}

func viewOf(inst ec2types.Instance) ec2View {
	v := ec2View{
		ip: awssdk.ToString(inst.PrivateIpAddress), typ: string(inst.InstanceType),
		spot: inst.InstanceLifecycle == ec2types.InstanceLifecycleTypeSpot, launched: awssdk.ToTime(inst.LaunchTime),
	}
	if inst.State != nil {
		v.state = inst.State.Name
	}
	if inst.Placement != nil {
		v.zone = awssdk.ToString(inst.Placement.AvailabilityZone)
	}
	return v
}

// host joins the group's and EC2's views of one instance; false when it is not a host.
func (p *Provider) host(id string, c candidate, inst ec2View) (providers.Host, bool) {
	state := inst.state
	leaving := c.leaving
	switch state {
	case ec2types.InstanceStateNameRunning:
	case ec2types.InstanceStateNameStopping, ec2types.InstanceStateNameShuttingDown:
		leaving = true
	default:
		p.log.Debug("instance not running; skipped", "host", id, "state", string(state))
		return providers.Host{}, false
	}
	if inst.ip == "" {
		p.log.Debug("instance has no private IP yet; skipped", "host", id)
		return providers.Host{}, false
	}
	typ := cmp.Or(inst.typ, awssdk.ToString(c.in.InstanceType))
	return providers.Host{
		ID:       id,
		Addr:     inst.ip,
		Slots:    providers.SlotsFor(typ, gpuSlots, p.cfg.SlotsPerHost),
		Zone:     cmp.Or(inst.zone, awssdk.ToString(c.in.AvailabilityZone)),
		Spot:     inst.spot,
		Type:     typ,
		Launched: inst.launched,
		Leaving:  leaving,
	}, true
}

// describeGroup finds the group (paginated, although one name is one group).
func (p *Provider) describeGroup(ctx context.Context) (asgtypes.AutoScalingGroup, error) {
	in := &autoscaling.DescribeAutoScalingGroupsInput{
		AutoScalingGroupNames: []string{p.cfg.ASG},
		MaxRecords:            awssdk.Int32(asgPageSize),
	}
	seen := map[string]bool{}
	for page := 0; page < maxPages; page++ {
		var out *autoscaling.DescribeAutoScalingGroupsOutput
		err := p.call(ctx, epASG, maxAttempts, func(ctx context.Context) (err error) {
			out, err = p.asg.DescribeAutoScalingGroups(ctx, in)
			return err
		})
		if err != nil {
			return asgtypes.AutoScalingGroup{}, explain(err, "autoscaling:DescribeAutoScalingGroups")
		}
		for _, g := range out.AutoScalingGroups {
			if awssdk.ToString(g.AutoScalingGroupName) == p.cfg.ASG {
				return g, nil
			}
		}
		next := awssdk.ToString(out.NextToken)
		if next == "" {
			return asgtypes.AutoScalingGroup{}, fmt.Errorf("%w: check --asg (names are case-sensitive) and --region; "+
				"`aws autoscaling describe-auto-scaling-groups --auto-scaling-group-names %q` lists it where it exists", errGroupNotFound, p.cfg.ASG)
		}
		if seen[next] {
			return asgtypes.AutoScalingGroup{}, fmt.Errorf("describe auto scaling groups: the API repeated page token %.40q", next)
		}
		seen[next] = true
		in.NextToken = awssdk.String(next)
	}
	return asgtypes.AutoScalingGroup{}, fmt.Errorf("describe auto scaling groups: more than %d pages", maxPages)
}

// describeInstances pages through EC2's view of the group's instances that may be hosts. It
// selects them by the group's tag rather than by ID: DescribeInstances cannot page a list of
// IDs, fails the whole call when one of them has just disappeared
// (InvalidInstanceID.NotFound), and an instance-id filter takes at most 200 values; the tag
// and the largest page make 10,000 instances 10 calls.
func (p *Provider) describeInstances(ctx context.Context, wanted map[string]candidate) (map[string]ec2View, error) {
	in := &ec2.DescribeInstancesInput{
		Filters: []ec2types.Filter{
			{Name: awssdk.String("tag:" + groupTag), Values: []string{p.cfg.ASG}},
			// Every state but terminated, which lingers for up to an hour after the group
			// forgot the instance: the others are needed to tell "stopped" from "not EC2's
			// answer" below.
			{Name: awssdk.String("instance-state-name"), Values: []string{
				string(ec2types.InstanceStateNamePending), string(ec2types.InstanceStateNameRunning),
				string(ec2types.InstanceStateNameStopping), string(ec2types.InstanceStateNameStopped),
				string(ec2types.InstanceStateNameShuttingDown)}},
		},
		MaxResults: awssdk.Int32(ec2PageSize),
	}
	found := make(map[string]ec2View, len(wanted))
	seen := map[string]bool{}
	for page := 0; page < maxPages; page++ {
		var out *ec2.DescribeInstancesOutput
		err := p.call(ctx, epEC2, maxAttempts, func(ctx context.Context) (err error) {
			out, err = p.ec2.DescribeInstances(ctx, in)
			return err
		})
		if err != nil {
			return nil, explain(err, "ec2:DescribeInstances")
		}
		for _, r := range out.Reservations {
			for _, inst := range r.Instances {
				id := awssdk.ToString(inst.InstanceId)
				if _, ok := wanted[id]; ok {
					found[id] = viewOf(inst)
				}
			}
		}
		next := awssdk.ToString(out.NextToken)
		if next == "" {
			return found, nil
		}
		if seen[next] {
			return nil, fmt.Errorf("describe instances: the API repeated page token %.40q", next)
		}
		seen[next] = true
		in.NextToken = awssdk.String(next)
	}
	return nil, fmt.Errorf("describe instances: more than %d pages", maxPages)
}
