package main

import (
	"context"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/aws"
)

// newAWSProvider is --provider aws: the Auto Scaling group --asg in --region, and with
// --sqs-queue-url the interruption notices EventBridge sends to that queue. Either way it
// reads spot prices (providers.SpotPricer) for the driver's cost accounting.
func newAWSProvider(o providerOptions) (providers.Provider, error) {
	p, err := aws.New(aws.Config{
		ASG:          o.ASG,
		Region:       o.Region,
		Endpoint:     o.Endpoint,
		SQSQueueURL:  o.SQSQueueURL,
		SlotsPerHost: o.SlotsPerHost,
		Logger:       o.Logger,
	})
	if err != nil {
		return nil, err
	}
	if o.SQSQueueURL == "" {
		return awsWithoutQueue{p, p, p}, nil
	}
	return p, nil
}

// awsWithoutQueue is the provider without a queue, which has no notices to give: it hides
// Notices and CompleteNotice so that the driver, which finds them by type assertion, does not
// poll for nothing, and keeps the spot prices and the group's steering, which need no queue.
type awsWithoutQueue struct {
	providers.Provider
	providers.SpotPricer
	providers.Capacity
}

// Check is the provider's own (providers.Checker): without a queue, the queue's checks and
// permissions are not asked.
func (w awsWithoutQueue) Check(ctx context.Context, needs providers.CheckNeeds) []providers.Check {
	if c, ok := w.Provider.(providers.Checker); ok {
		return c.Check(ctx, needs)
	}
	return nil
}
