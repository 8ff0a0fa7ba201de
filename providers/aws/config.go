package aws

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// DefaultMinInterval is how long a discovery result is reused before the APIs are asked again.
// The driver polls every second; an Auto Scaling group changes on the scale of minutes, and
// DescribeInstances is throttled per account, shared with everything else in it.
const DefaultMinInterval = 5 * time.Second

// Config describes one Auto Scaling group. Credentials come from the SDK's default chain
// (environment, shared config and credentials files, SSO, web identity, the instance role).
type Config struct {
	// ASG is the Auto Scaling group's name (--asg). Required.
	ASG string
	// Region is the group's region (--region); empty: the SDK's (AWS_REGION, the profile's).
	Region string
	// Endpoint overrides the API endpoint of Auto Scaling, EC2 and SQS alike (--endpoint): a
	// VPC endpoint, a proxy, a test server. Empty: the region's public endpoints.
	Endpoint string
	// SQSQueueURL is the queue EventBridge (or a lifecycle hook) sends notices to
	// (--sqs-queue-url). Empty: no notices; Notices returns none.
	SQSQueueURL string
	// SlotsPerHost overrides the slot count of every host (--slots-per-host); 0: the instance
	// type's GPU count from the table in gpus.go, else 1.
	SlotsPerHost int
	// MinInterval: a Hosts call sooner than this after the last successful poll returns that
	// poll's result without calling the APIs. 0: DefaultMinInterval.
	MinInterval time.Duration
	// Logger receives what is skipped and why (debug) and lost notices (warn); nil discards.
	Logger *slog.Logger
}

var regionName = regexp.MustCompile(`^[a-z]{2}(-[a-z0-9]+)+-[0-9]+$`)

// Validate reports the first invalid field, naming its flag. It makes no call.
func (c Config) Validate() error {
	switch {
	case c.ASG == "":
		return errors.New("--asg is required: the name of the Auto Scaling group of GPU instances")
	case len(c.ASG) > 255 || strings.ContainsAny(c.ASG, "\r\n\t"):
		return fmt.Errorf("--asg %.40q…: not an Auto Scaling group name (1 to 255 characters, no tabs or newlines)", c.ASG)
	case c.Region != "" && !regionName.MatchString(c.Region):
		return fmt.Errorf("--region %q: want a region name such as us-east-1", c.Region)
	case c.SlotsPerHost < 0 || c.SlotsPerHost > providers.MaxSlots:
		return fmt.Errorf("--slots-per-host %d: must be between 1 and %d (0: the instance type's GPU count)", c.SlotsPerHost, providers.MaxSlots)
	case c.MinInterval < 0:
		return fmt.Errorf("minimum refresh interval %v: must not be negative (0: the default %v)", c.MinInterval, DefaultMinInterval)
	}
	if c.Endpoint != "" {
		if err := checkURL(c.Endpoint); err != nil {
			return fmt.Errorf("--endpoint %q: %v, e.g. https://vpce-0123-abcd.ec2.us-east-1.vpce.amazonaws.com", c.Endpoint, err)
		}
	}
	if c.SQSQueueURL != "" {
		if err := checkURL(c.SQSQueueURL); err != nil {
			return fmt.Errorf("--sqs-queue-url %q: %v, e.g. https://sqs.us-east-1.amazonaws.com/123456789012/elasticd-notices", c.SQSQueueURL, err)
		}
		// A queue in another region is answered with QueueDoesNotExist, which reads like a typo.
		u, _ := url.Parse(c.SQSQueueURL)
		if r, ok := queueRegion(u.Host); ok && c.Region != "" && r != c.Region {
			return fmt.Errorf("--sqs-queue-url %q is in region %s but --region is %s: the queue must be in the group's region", c.SQSQueueURL, r, c.Region)
		}
	}
	return nil
}

func checkURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return errors.New("not a URL")
	case u.Scheme != "https" && u.Scheme != "http":
		return errors.New("want an absolute http(s) URL")
	case u.Host == "":
		return errors.New("no host")
	}
	return nil
}

// queueRegion reads the region out of a public SQS endpoint host (sqs.<region>.amazonaws.com).
func queueRegion(host string) (string, bool) {
	rest, ok := strings.CutPrefix(host, "sqs.")
	if !ok {
		return "", false
	}
	r, _, ok := strings.Cut(rest, ".amazonaws.com")
	if !ok || !regionName.MatchString(r) {
		return "", false
	}
	return r, true
}

func (c Config) withDefaults() Config {
	if c.MinInterval == 0 {
		c.MinInterval = DefaultMinInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
