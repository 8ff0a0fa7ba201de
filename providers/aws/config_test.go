package aws_test

import (
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers/aws"
)

// TestValidate: each invalid field is an error that names its flag; New makes no call.
func TestValidate(t *testing.T) {
	ok := aws.Config{ASG: "gpu-workers", Region: "us-east-1"}
	for _, c := range []struct {
		name string
		edit func(*aws.Config)
		flag string // "" when valid
	}{
		{"Minimal", func(c *aws.Config) {}, ""},
		{"NoRegion", func(c *aws.Config) { c.Region = "" }, ""}, // the SDK's own, checked at the first poll
		{"Full", func(c *aws.Config) {
			c.Endpoint, c.SQSQueueURL = "https://vpce-1.autoscaling.us-east-1.vpce.amazonaws.com", "https://sqs.us-east-1.amazonaws.com/123456789012/q"
			c.SlotsPerHost, c.MinInterval = 8, time.Minute
		}, ""},
		{"NoASG", func(c *aws.Config) { c.ASG = "" }, "--asg"},
		{"LongASG", func(c *aws.Config) { c.ASG = strings.Repeat("a", 256) }, "--asg"},
		{"BadRegion", func(c *aws.Config) { c.Region = "US East" }, "--region"},
		{"NegativeSlots", func(c *aws.Config) { c.SlotsPerHost = -1 }, "--slots-per-host"},
		{"TooManySlots", func(c *aws.Config) { c.SlotsPerHost = 1 << 20 }, "--slots-per-host"},
		{"EndpointNotURL", func(c *aws.Config) { c.Endpoint = "ec2.internal:443" }, "--endpoint"},
		{"QueueNotURL", func(c *aws.Config) { c.SQSQueueURL = "elasticd-notices" }, "--sqs-queue-url"},
		{"QueueInOtherRegion", func(c *aws.Config) { c.SQSQueueURL = "https://sqs.eu-west-1.amazonaws.com/123456789012/q" }, "--sqs-queue-url"},
		{"NegativeInterval", func(c *aws.Config) { c.MinInterval = -time.Second }, "interval"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.edit(&cfg)
			err := cfg.Validate()
			_, newErr := aws.New(cfg)
			switch {
			case c.flag == "" && (err != nil || newErr != nil):
				t.Errorf("valid config: Validate %v, New %v", err, newErr)
			case c.flag != "" && (err == nil || newErr == nil):
				t.Errorf("Validate %v, New %v; want both to fail", err, newErr)
			case c.flag != "" && !strings.Contains(err.Error(), c.flag):
				t.Errorf("error %q does not name %s", err, c.flag)
			case err != nil:
				t.Logf("%v", err)
			}
		})
	}
}
