package main

import (
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/aws"
)

// newAWSProvider is --provider aws: the Auto Scaling group --asg in --region, and with
// --sqs-queue-url the interruption notices EventBridge sends to that queue.
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
		// Without a queue the provider has no notices to give: hide Notices and CompleteNotice
		// so that the driver, which finds them by type assertion, does not poll for nothing.
		return struct{ providers.Provider }{p}, nil
	}
	return p, nil
}
