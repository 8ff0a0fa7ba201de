package aws

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	asgtypes "github.com/aws/aws-sdk-go-v2/service/autoscaling/types"
	"github.com/aws/smithy-go"

	"github.com/elasticd/elasticd/providers"
)

// Steering the group (providers.Capacity): its size, one instance handed back for a
// replacement, and the launches it failed, as its scaling activities tell them.

const (
	// activityPage is DescribeScalingActivities' largest page. Activities come newest first,
	// and a group launches far fewer than 100 instances an hour: one page covers the window.
	activityPage = 100
	// failureWindow is how far back LaunchFailures looks: older failures say little about
	// the capacity there is now.
	failureWindow = time.Hour
)

var _ providers.Capacity = (*Provider)(nil)

// GroupSize reads the group's DesiredCapacity, MinSize and MaxSize, and counts its instances
// in any lifecycle state. It is one DescribeAutoScalingGroups, never a cached poll.
func (p *Provider) GroupSize(ctx context.Context) (providers.GroupSize, error) {
	g, err := p.readGroup(ctx)
	if err != nil {
		return providers.GroupSize{}, err
	}
	return sizeOf(g), nil
}

func sizeOf(g asgtypes.AutoScalingGroup) providers.GroupSize {
	return providers.GroupSize{
		Desired:   int(awssdk.ToInt32(g.DesiredCapacity)),
		Min:       int(awssdk.ToInt32(g.MinSize)),
		Max:       int(awssdk.ToInt32(g.MaxSize)),
		Instances: len(g.Instances),
	}
}

// SetDesired reads the group, then sets its desired capacity to n: SetDesiredCapacity
// (HonorCooldown false: the driver's decision is not a scaling policy's), or, where n is
// below MinSize, one UpdateAutoScalingGroup that lowers MinSize and sets the desired capacity
// together. n above MaxSize is refused before any change; a size the group already has is
// not set again.
func (p *Provider) SetDesired(ctx context.Context, n int) error {
	if n < 0 || n > math.MaxInt32 {
		return p.loop.Errorf("set the desired capacity to %d: not a size", n)
	}
	g, err := p.readGroup(ctx)
	if err != nil {
		return err
	}
	s := sizeOf(g)
	switch {
	case n > s.Max:
		return p.loop.Errorf("set the desired capacity to %d: %w (%d): elasticd never raises it; "+
			"raise the group's MaxSize or ask for fewer hosts", n, providers.ErrAboveMax, s.Max)
	case n == s.Desired:
		return nil
	case n < s.Min:
		op := fmt.Sprintf("lower the minimum size from %d to %d with the desired capacity", s.Min, n)
		err = p.loop.Do(ctx, epASG, func(ctx context.Context) error {
			_, err := p.asg.UpdateAutoScalingGroup(ctx, &autoscaling.UpdateAutoScalingGroupInput{
				AutoScalingGroupName: awssdk.String(p.cfg.ASG),
				MinSize:              awssdk.Int32(int32(n)),
				DesiredCapacity:      awssdk.Int32(int32(n)),
			})
			return resizeErr(op, "autoscaling:UpdateAutoScalingGroup", err)
		})
	default:
		op := fmt.Sprintf("set the desired capacity to %d", n)
		err = p.loop.Do(ctx, epASG, func(ctx context.Context) error {
			_, err := p.asg.SetDesiredCapacity(ctx, &autoscaling.SetDesiredCapacityInput{
				AutoScalingGroupName: awssdk.String(p.cfg.ASG),
				DesiredCapacity:      awssdk.Int32(int32(n)),
				HonorCooldown:        awssdk.Bool(false),
			})
			return resizeErr(op, "autoscaling:SetDesiredCapacity", err)
		})
	}
	if err != nil {
		return err
	}
	p.log.Info("set the group's desired capacity", "desired", n, "was", s.Desired, "min", min(n, s.Min), "max", s.Max)
	p.loop.Forget() // the group is changing: the next Hosts asks the APIs
	return nil
}

// Replace terminates hostID with TerminateInstanceInAutoScalingGroup, not decrementing the
// desired capacity: the group launches a replacement. The group is read first, because that
// call terminates an instance of whatever group holds it: an instance the group does not list
// is ErrNotInGroup, and one it is already taking out (Terminating*) is not terminated again.
func (p *Provider) Replace(ctx context.Context, hostID string) error {
	g, err := p.readGroup(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(g.Instances, func(in asgtypes.Instance) bool { return awssdk.ToString(in.InstanceId) == hostID })
	if hostID == "" || i < 0 {
		return p.loop.Errorf("replace %q: %w", hostID, providers.ErrNotInGroup)
	}
	if state := string(g.Instances[i].LifecycleState); strings.HasPrefix(state, "Terminat") {
		p.log.Debug("instance already leaving the group; not terminated again", "host", hostID, "lifecycle", state)
		return nil
	}
	op := "replace " + hostID
	err = p.loop.Do(ctx, epASG, func(ctx context.Context) error {
		_, err := p.asg.TerminateInstanceInAutoScalingGroup(ctx, &autoscaling.TerminateInstanceInAutoScalingGroupInput{
			InstanceId:                     awssdk.String(hostID),
			ShouldDecrementDesiredCapacity: awssdk.Bool(false),
		})
		return replaceErr(op, err)
	})
	if err != nil {
		return err
	}
	p.log.Info("terminated an instance for the group to replace", "host", hostID)
	p.loop.Forget()
	return nil
}

// LaunchFailures reads the group's newest scaling activities (one DescribeScalingActivities)
// and returns those of the last hour that Failed or were Cancelled, newest last. Activities
// still waiting (for a spot request, an instance) are not failures.
func (p *Provider) LaunchFailures(ctx context.Context) ([]providers.LaunchFailure, error) {
	if err := p.clients(ctx); err != nil {
		return nil, p.fail(ctx, err)
	}
	var out *autoscaling.DescribeScalingActivitiesOutput
	err := p.loop.Do(ctx, epASG, func(ctx context.Context) (err error) {
		out, err = p.asg.DescribeScalingActivities(ctx, &autoscaling.DescribeScalingActivitiesInput{
			AutoScalingGroupName: awssdk.String(p.cfg.ASG),
			MaxRecords:           awssdk.Int32(activityPage),
		})
		return readErr("list the scaling activities", "autoscaling:DescribeScalingActivities", err)
	})
	if err != nil {
		return nil, err
	}
	return launchFailures(out.Activities, time.Now().Add(-failureWindow)), nil
}

// launchFailures keeps the failed and cancelled activities that started at or after since.
func launchFailures(acts []asgtypes.Activity, since time.Time) []providers.LaunchFailure {
	var fs []providers.LaunchFailure
	for _, a := range acts {
		if a.StatusCode != asgtypes.ScalingActivityStatusCodeFailed && a.StatusCode != asgtypes.ScalingActivityStatusCodeCancelled {
			continue
		}
		at := awssdk.ToTime(a.StartTime)
		if at.IsZero() {
			at = awssdk.ToTime(a.EndTime)
		}
		id := awssdk.ToString(a.ActivityId)
		if id == "" || at.Before(since) {
			continue
		}
		msg := cmp.Or(awssdk.ToString(a.StatusMessage), awssdk.ToString(a.Description))
		code := launchCode(msg)
		fs = append(fs, providers.LaunchFailure{
			ID: id, At: at, Kind: providers.Classify(code, msg), Code: code, Message: msg,
			Zone: cmp.Or(detailsZone(awssdk.ToString(a.Details)), zoneIn.FindString(msg)),
		})
	}
	slices.Reverse(fs) // the API answers newest first
	slices.SortStableFunc(fs, func(a, b providers.LaunchFailure) int { return a.At.Compare(b.At) })
	return fs
}

var (
	// codeIn finds EC2's error code in an activity's StatusMessage, which Auto Scaling writes
	// as "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot
	// capacity available…" or "UnfulfillableCapacity - Unable to fulfill capacity…".
	codeIn = regexp.MustCompile(`(?:^|[.:]\s+)([A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+(?:\.[A-Za-z0-9]+)*) - `)
	// zoneIn finds an availability zone named in a message ("…in the Availability Zone you
	// requested (us-east-1a)").
	zoneIn = regexp.MustCompile(`\b[a-z]{2}(?:-[a-z]+)+-\d+[a-z]\b`)
)

// codeless are EC2 messages that Auto Scaling passes on without their code, and the code.
var codeless = []struct{ text, code string }{
	{"Max spot instance count exceeded", "MaxSpotInstanceCountExceeded"},
	{"We currently do not have sufficient", "InsufficientInstanceCapacity"},
}

// launchCode is the EC2 error code in an activity's message, or the code of an EC2 message it
// quotes without one; empty when it names none.
func launchCode(msg string) string {
	if m := codeIn.FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	for _, c := range codeless {
		if strings.Contains(strings.ToLower(msg), strings.ToLower(c.text)) {
			return c.code
		}
	}
	return ""
}

// detailsZone reads the zone from an activity's Details, a JSON object such as
// {"Subnet ID":"subnet-0123","Availability Zone":"us-east-1a"}.
func detailsZone(details string) string {
	var d map[string]any
	if json.Unmarshal([]byte(details), &d) != nil {
		return ""
	}
	z, _ := d["Availability Zone"].(string)
	return z
}

// readGroup is one read of the group for a capacity call (paced and retried as a poll's),
// its error prefixed as a poll's; an unknown group is errGroupNotFound, naming --asg.
func (p *Provider) readGroup(ctx context.Context) (asgtypes.AutoScalingGroup, error) {
	if err := p.clients(ctx); err != nil {
		return asgtypes.AutoScalingGroup{}, p.fail(ctx, err)
	}
	g, err := p.describeGroup(ctx)
	if err != nil {
		return asgtypes.AutoScalingGroup{}, p.fail(ctx, readErr("read the group", "autoscaling:DescribeAutoScalingGroups", err))
	}
	return g, nil
}

// fail prefixes the error of a capacity call not made through Loop.Do as Do prefixes one,
// and makes it wrap ctx's error when ctx ended.
func (p *Provider) fail(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (the call's context: %w)", err, cerr)
	}
	return p.loop.Errorf("%w", err)
}

// apiError is the code and message of an error the API answered; empty when none.
func apiError(err error) (code, msg string) {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode(), ae.ErrorMessage()
	}
	return "", ""
}

// readErr: a read the credentials may not make is refused.
func readErr(op, action string, err error) error {
	if err == nil {
		return nil
	}
	if code, _ := apiError(err); deniedCodes[code] {
		return providers.Refused(op, action, err)
	}
	return err
}

// resizeErr maps the errors of SetDesiredCapacity and UpdateAutoScalingGroup: denied is
// refused for want of action; a ValidationError is ErrAboveMax when it says the size is above
// the group's maximum (MaxSize was lowered since the group was read), else refused. Anything else, the
// transient ScalingActivityInProgress and ResourceContention included, is left to Classify.
func resizeErr(op, action string, err error) error {
	if err == nil {
		return nil
	}
	code, msg := apiError(err)
	switch {
	case deniedCodes[code]:
		return providers.Refused(op, action, err)
	case code == "ValidationError" && aboveMax(msg):
		return fmt.Errorf("%s: %w: %w", op, providers.ErrAboveMax, err)
	case code == "ValidationError":
		return providers.Refused(op, "", err)
	}
	return fmt.Errorf("%s: %w", op, explain(err, action))
}

// aboveMax: a ValidationError that says the desired capacity is above the maximum, as
// "New SetDesiredCapacity value 5 is above max value 4 for the AutoScalingGroup." does.
func aboveMax(msg string) bool { return strings.Contains(strings.ToLower(msg), "above max") }

// replaceErr maps TerminateInstanceInAutoScalingGroup's errors: denied is refused; "Instance
// Id not found - No managed instance found for instance ID: i-…" (the instance left the group
// since it was read) is ErrNotInGroup; any other ValidationError is refused.
func replaceErr(op string, err error) error {
	if err == nil {
		return nil
	}
	code, msg := apiError(err)
	lower := strings.ToLower(msg)
	switch {
	case deniedCodes[code]:
		return providers.Refused(op, "autoscaling:TerminateInstanceInAutoScalingGroup", err)
	case code == "ValidationError" && (strings.Contains(lower, "not found") || strings.Contains(lower, "no managed instance") ||
		strings.Contains(lower, "not part of")):
		return fmt.Errorf("%s: %w: %w", op, providers.ErrNotInGroup, err)
	case code == "ValidationError":
		return providers.Refused(op, "", err)
	}
	return fmt.Errorf("%s: %w", op, explain(err, "autoscaling:TerminateInstanceInAutoScalingGroup"))
}
