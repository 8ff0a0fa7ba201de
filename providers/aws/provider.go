// Package aws discovers the hosts of an EC2 Auto Scaling group and, from an SQS queue fed by
// EventBridge or a lifecycle hook, the notices that hosts will go away (spot interruptions).
package aws

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/throttle"
)

// The SDK seam: the few calls the provider makes. The SDK's clients implement these; tests
// drive those real clients against an in-process server that speaks the wire formats.
type (
	asgAPI interface {
		DescribeAutoScalingGroups(context.Context, *autoscaling.DescribeAutoScalingGroupsInput, ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error)
		CompleteLifecycleAction(context.Context, *autoscaling.CompleteLifecycleActionInput, ...func(*autoscaling.Options)) (*autoscaling.CompleteLifecycleActionOutput, error)
	}
	ec2API interface {
		DescribeInstances(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
		DescribeSpotPriceHistory(context.Context, *ec2.DescribeSpotPriceHistoryInput, ...func(*ec2.Options)) (*ec2.DescribeSpotPriceHistoryOutput, error)
	}
	sqsAPI interface {
		ReceiveMessage(context.Context, *sqs.ReceiveMessageInput, ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
		DeleteMessageBatch(context.Context, *sqs.DeleteMessageBatchInput, ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	}
)

// Provider is one Auto Scaling group. It implements providers.Provider, and with a queue
// configured also providers.Noticer and providers.NoticeCompleter. Safe for concurrent use;
// it starts no goroutines.
type Provider struct {
	cfg Config
	log *slog.Logger

	// hostsTurn and noticesTurn let one poll of each kind run at a time; a caller waits for
	// its turn under its own context (a channel, unlike a mutex, can be given up on).
	hostsTurn, noticesTurn chan struct{}

	initMu sync.Mutex // guards the lazy construction of the clients below
	ready  bool
	region string
	asg    asgAPI
	ec2    ec2API
	sqs    sqsAPI

	// gates: autoscaling, ec2 and sqs rest independently after failures (backoff.go).
	gates *throttle.Gates

	mu       sync.Mutex       // guards what follows: small, never held across a call
	cached   []providers.Host // the last successful poll's hosts
	cachedAt time.Time        // when it started; zero before the first
	members  map[string]bool  // every instance of the group at the last poll; nil before
}

// New checks cfg and returns its provider. It makes no call and reads no file: the SDK's
// configuration and credentials are loaded on the first poll, whose error says what is wrong.
func New(cfg Config) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Provider{
		cfg: cfg, log: cfg.Logger.With("provider", "aws"),
		hostsTurn: make(chan struct{}, 1), noticesTurn: make(chan struct{}, 1),
		gates: throttle.New(throttle.Config{Jitter: true}),
	}, nil
}

// clients builds the SDK clients once: region, endpoint and credentials from cfg and the SDK's
// default chain (credentials resolve on the first request, not here).
func (p *Provider) clients(ctx context.Context) error {
	p.initMu.Lock()
	defer p.initMu.Unlock()
	if p.ready {
		return nil
	}
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
		return fmt.Errorf("load the AWS configuration (AWS_* environment, ~/.aws/config, AWS_PROFILE): %w", err)
	}
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
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("aws: %s: %w", p.where(), err)
	}
	select {
	case p.hostsTurn <- struct{}{}:
		defer func() { <-p.hostsTurn }()
	case <-ctx.Done():
		return nil, fmt.Errorf("aws: %s: %w", p.where(), ctx.Err())
	}
	p.mu.Lock()
	if !p.cachedAt.IsZero() && time.Since(p.cachedAt) < p.cfg.MinInterval {
		hosts := slices.Clone(p.cached)
		p.mu.Unlock()
		return hosts, nil
	}
	p.mu.Unlock()

	start := time.Now()
	hosts, members, err := p.discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("aws: %s: %w", p.where(), err)
	}
	p.mu.Lock()
	p.cached, p.cachedAt, p.members = hosts, start, members
	p.mu.Unlock()
	return slices.Clone(hosts), nil
}

var (
	_ providers.Provider        = (*Provider)(nil)
	_ providers.Noticer         = (*Provider)(nil)
	_ providers.NoticeCompleter = (*Provider)(nil)
)
