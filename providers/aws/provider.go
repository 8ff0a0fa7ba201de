// Package aws discovers the hosts of an EC2 Auto Scaling group and, from an SQS queue fed by
// EventBridge or a lifecycle hook, the notices that hosts will go away (spot interruptions).
package aws

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/throttle"
)

// The SDK seam: the few calls the provider makes. The SDK's clients implement these; tests
// drive those real clients against an in-process server that speaks the wire formats.
type (
	asgAPI interface {
		DescribeAutoScalingGroups(context.Context, *autoscaling.DescribeAutoScalingGroupsInput, ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error)
		CompleteLifecycleAction(context.Context, *autoscaling.CompleteLifecycleActionInput, ...func(*autoscaling.Options)) (*autoscaling.CompleteLifecycleActionOutput, error)
		SetDesiredCapacity(context.Context, *autoscaling.SetDesiredCapacityInput, ...func(*autoscaling.Options)) (*autoscaling.SetDesiredCapacityOutput, error)
		UpdateAutoScalingGroup(context.Context, *autoscaling.UpdateAutoScalingGroupInput, ...func(*autoscaling.Options)) (*autoscaling.UpdateAutoScalingGroupOutput, error)
		TerminateInstanceInAutoScalingGroup(context.Context, *autoscaling.TerminateInstanceInAutoScalingGroupInput, ...func(*autoscaling.Options)) (*autoscaling.TerminateInstanceInAutoScalingGroupOutput, error)
		DescribeScalingActivities(context.Context, *autoscaling.DescribeScalingActivitiesInput, ...func(*autoscaling.Options)) (*autoscaling.DescribeScalingActivitiesOutput, error)
		CreateOrUpdateTags(context.Context, *autoscaling.CreateOrUpdateTagsInput, ...func(*autoscaling.Options)) (*autoscaling.CreateOrUpdateTagsOutput, error)
		DeleteTags(context.Context, *autoscaling.DeleteTagsInput, ...func(*autoscaling.Options)) (*autoscaling.DeleteTagsOutput, error)
	}
	ec2API interface {
		DescribeInstances(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
		DescribeSpotPriceHistory(context.Context, *ec2.DescribeSpotPriceHistoryInput, ...func(*ec2.Options)) (*ec2.DescribeSpotPriceHistoryOutput, error)
	}
	sqsAPI interface {
		ReceiveMessage(context.Context, *sqs.ReceiveMessageInput, ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
		DeleteMessageBatch(context.Context, *sqs.DeleteMessageBatchInput, ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
		GetQueueAttributes(context.Context, *sqs.GetQueueAttributesInput, ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error) // Check only
	}
	// The calls only Check makes (check.go): whose the credentials are, what IAM lets them
	// do, and which EventBridge rules feed the queue.
	stsAPI interface {
		GetCallerIdentity(context.Context, *sts.GetCallerIdentityInput, ...func(*sts.Options)) (*sts.GetCallerIdentityOutput, error)
	}
	iamAPI interface {
		GetRole(context.Context, *iam.GetRoleInput, ...func(*iam.Options)) (*iam.GetRoleOutput, error)
		SimulatePrincipalPolicy(context.Context, *iam.SimulatePrincipalPolicyInput, ...func(*iam.Options)) (*iam.SimulatePrincipalPolicyOutput, error)
	}
	eventsAPI interface {
		ListRuleNamesByTarget(context.Context, *eventbridge.ListRuleNamesByTargetInput, ...func(*eventbridge.Options)) (*eventbridge.ListRuleNamesByTargetOutput, error)
		DescribeRule(context.Context, *eventbridge.DescribeRuleInput, ...func(*eventbridge.Options)) (*eventbridge.DescribeRuleOutput, error)
	}
)

// Provider is one Auto Scaling group. It implements providers.Provider, providers.Capacity
// (capacity.go), providers.Claimer (claim.go) and providers.Checker (check.go), and with a
// queue configured also providers.Noticer and providers.NoticeCompleter. Safe for concurrent
// use; it starts no goroutines.
type Provider struct {
	cfg Config
	log *slog.Logger

	// loop is the portable part: one poll of each kind at a time, the reuse of hosts within
	// MinInterval, the retries of each endpoint (backoff.go), the "aws: " prefix.
	loop *providers.Loop

	initMu sync.Mutex // guards the lazy construction of the clients below
	ready  bool
	region string
	asg    asgAPI
	ec2    ec2API
	sqs    sqsAPI
	sts    stsAPI
	iam    iamAPI
	events eventsAPI

	mu      sync.Mutex      // guards what follows: small, never held across a call
	members map[string]bool // every instance of the group at the last poll; nil before
}

// driver is the cloud's own part of the provider, under the loop: its SDK calls.
type driver struct{ p *Provider }

// New checks cfg and returns its provider. It makes no call and reads no file: the SDK's
// configuration and credentials are loaded on the first poll, whose error says what is wrong.
func New(cfg Config) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p := &Provider{cfg: cfg, log: cfg.Logger.With("provider", "aws")}
	p.loop = providers.NewLoop(providers.LoopConfig{
		Name: "aws", Where: p.where, MinInterval: cfg.MinInterval, Tries: maxAttempts,
		Gates: throttle.Config{Jitter: true}, Logger: p.log,
	}, driver{p})
	return p, nil
}

// clients builds the SDK clients once: region, endpoint and credentials from cfg and the SDK's
// default chain (credentials resolve on the first request, not here).
func (p *Provider) clients(ctx context.Context) error {
	p.initMu.Lock()
	defer p.initMu.Unlock()
	if p.ready {
		return nil
	}
	ac, err := p.loadConfig(ctx)
	if err != nil {
		return err
	}
	return p.useConfigLocked(ac)
}

// loadConfig loads the SDK's configuration as the provider uses it: cfg's region and endpoint
// over the SDK's default chain (AWS_* environment, shared config and credentials files).
func (p *Provider) loadConfig(ctx context.Context) (awssdk.Config, error) {
	opts := []func(*config.LoadOptions) error{
		config.WithRetryer(func() awssdk.Retryer { return awssdk.NopRetryer{} }), // backoff.go retries
	}
	if p.cfg.Region != "" {
		opts = append(opts, config.WithRegion(p.cfg.Region))
	}
	if p.cfg.Endpoint != "" {
		opts = append(opts, config.WithBaseEndpoint(p.cfg.Endpoint))
	}
	ac, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return awssdk.Config{}, fmt.Errorf("load the AWS configuration (AWS_* environment, ~/.aws/config, AWS_PROFILE): %w", err)
	}
	return ac, nil
}

// useConfig builds the clients from ac, unless they are built already.
func (p *Provider) useConfig(ac awssdk.Config) error {
	p.initMu.Lock()
	defer p.initMu.Unlock()
	if p.ready {
		return nil
	}
	return p.useConfigLocked(ac)
}

// useConfigLocked builds every client from ac; p.initMu held.
func (p *Provider) useConfigLocked(ac awssdk.Config) error {
	if ac.Region == "" {
		return fmt.Errorf("--region is required: no region in the flags, AWS_REGION or the AWS profile")
	}
	p.region = ac.Region
	// Wrapped only now: loading configures the SDK's own client (AWS_CA_BUNDLE, for one,
	// needs it unwrapped), and leaves none when nothing needed configuring.
	if ac.HTTPClient == nil {
		ac.HTTPClient = awshttp.NewBuildableClient()
	}
	ac.HTTPClient = bufferedBodies{ac.HTTPClient}
	p.asg = autoscaling.NewFromConfig(ac)
	p.ec2 = ec2.NewFromConfig(ac)
	p.sqs = sqs.NewFromConfig(ac)
	p.sts = sts.NewFromConfig(ac)
	p.iam = iam.NewFromConfig(ac)
	p.events = eventbridge.NewFromConfig(ac)
	p.ready = true
	return nil
}

// where names the group for an error: the group, its region, and the endpoint when overridden.
func (p *Provider) where() string {
	return fmt.Sprintf("auto scaling group %q in %s", p.cfg.ASG, p.regionWhere())
}

// regionWhere names the region (resolved, else configured) and the endpoint when overridden.
func (p *Provider) regionWhere() string {
	p.initMu.Lock()
	region := p.region
	p.initMu.Unlock()
	if region == "" {
		region = p.cfg.Region
	}
	if region == "" {
		region = "(no region)"
	}
	if p.cfg.Endpoint != "" {
		region += " via " + p.cfg.Endpoint
	}
	return region
}

// Hosts lists the group's hosts: InService instances that EC2 reports running, with their
// private IP; instances the group or EC2 is taking away (Terminating*, Detaching,
// EnteringStandby; stopping, shutting-down) with Leaving set. Instances without a private IP
// yet are left out. A call within MinInterval of the last successful poll returns that poll's
// result and calls nothing.
func (p *Provider) Hosts(ctx context.Context) ([]providers.Host, error) {
	return p.loop.Hosts(ctx)
}

// ListHosts is one poll of the APIs; it remembers the group's members for Notices.
func (d driver) ListHosts(ctx context.Context) ([]providers.Host, error) {
	hosts, members, err := d.p.discover(ctx)
	if err != nil {
		return nil, err
	}
	d.p.mu.Lock()
	d.p.members = members
	d.p.mu.Unlock()
	return hosts, nil
}

var (
	_ providers.Provider        = (*Provider)(nil)
	_ providers.Noticer         = (*Provider)(nil)
	_ providers.NoticeCompleter = (*Provider)(nil)
)
