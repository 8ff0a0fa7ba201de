package aws

import (
	"context"
	"fmt"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	asgtypes "github.com/aws/aws-sdk-go-v2/service/autoscaling/types"

	"github.com/elasticd/elasticd/providers"
)

// The group's claim (providers.Claimer) is one of the group's own tags, providers.ClaimTagKey,
// not propagated to the instances it launches. DescribeAutoScalingGroups brings the group's
// tags with it; CreateOrUpdateTags writes one tag, DeleteTags removes one, each leaving the
// others as they are.

var _ providers.Claimer = (*Provider)(nil)

// Claim claims the group for c.Owner (providers.ClaimTag): a read of the group, and unless
// another driver's claim holds, CreateOrUpdateTags and a read back.
func (p *Provider) Claim(ctx context.Context, c providers.GroupClaim) (*providers.GroupClaim, error) {
	return providers.ClaimTag(ctx, claimTag{p}, c)
}

// Unclaim removes the group's claim when owner holds it: a read, then DeleteTags.
func (p *Provider) Unclaim(ctx context.Context, owner string) error {
	return providers.UnclaimTag(ctx, claimTag{p}, owner)
}

// claimTag is the group's claim tag (providers.TagStore).
type claimTag struct{ p *Provider }

// tagResource is the Auto Scaling resource type of a group's tag.
const tagResource = "auto-scaling-group"

func (t claimTag) ReadTag(ctx context.Context) (string, error) {
	g, err := t.p.readGroup(ctx)
	if err != nil {
		return "", err
	}
	for _, tag := range g.Tags {
		if awssdk.ToString(tag.Key) == providers.ClaimTagKey {
			return awssdk.ToString(tag.Value), nil
		}
	}
	return "", nil
}

func (t claimTag) WriteTag(ctx context.Context, value string) error {
	p := t.p
	return p.loop.Do(ctx, epASG, func(ctx context.Context) error {
		_, err := p.asg.CreateOrUpdateTags(ctx, &autoscaling.CreateOrUpdateTagsInput{Tags: []asgtypes.Tag{{
			ResourceId:        awssdk.String(p.cfg.ASG),
			ResourceType:      awssdk.String(tagResource),
			Key:               awssdk.String(providers.ClaimTagKey),
			Value:             awssdk.String(value),
			PropagateAtLaunch: awssdk.Bool(false),
		}}})
		return tagErr("write the group's "+providers.ClaimTagKey+" tag", "autoscaling:CreateOrUpdateTags", err)
	})
}

func (t claimTag) DeleteTag(ctx context.Context) error {
	p := t.p
	return p.loop.Do(ctx, epASG, func(ctx context.Context) error {
		_, err := p.asg.DeleteTags(ctx, &autoscaling.DeleteTagsInput{Tags: []asgtypes.Tag{{
			ResourceId:   awssdk.String(p.cfg.ASG),
			ResourceType: awssdk.String(tagResource),
			Key:          awssdk.String(providers.ClaimTagKey),
		}}})
		return tagErr("remove the group's "+providers.ClaimTagKey+" tag", "autoscaling:DeleteTags", err)
	})
}

// tagErr maps the errors of CreateOrUpdateTags and DeleteTags: denied is refused for want of
// action; a ValidationError (the group gone, a value AWS does not take) and LimitExceeded (the
// group has its 50 tags) are refused too: no retry changes them. Anything else, a throttle or
// ResourceContention, is left to Classify.
func tagErr(op, action string, err error) error {
	if err == nil {
		return nil
	}
	switch code, _ := apiError(err); {
	case deniedCodes[code]:
		return providers.Refused(op, action, err)
	case code == "ValidationError" || code == "LimitExceeded":
		return providers.Refused(op, "", err)
	}
	return fmt.Errorf("%s: %w", op, explain(err, action))
}
