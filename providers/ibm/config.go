package ibm

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"
	"github.com/elasticd/elasticd/providers"
)

// Defaults of Config.
const (
	// DefaultMinInterval spaces the polls that reach the API: the driver asks every second,
	// and a group of a thousand members costs twenty requests a poll.
	DefaultMinInterval = 5 * time.Second
	// DefaultMaxBackoff bounds every wait for one endpoint: a Retry-After, however long, and
	// the exponential backoff after repeated throttling or server errors.
	DefaultMaxBackoff = 30 * time.Second
)

// Config says which instance group to watch and how to reach the VPC API.
type Config struct {
	// InstanceGroup is the VPC instance group, by name or ID (--instance-group).
	InstanceGroup string
	// Region selects the regional endpoint https://<region>.iaas.cloud.ibm.com/v1
	// (--region). It may be empty when Endpoint is set.
	Region string
	// Endpoint overrides the VPC API base URL, e.g. a private endpoint
	// https://us-south.private.iaas.cloud.ibm.com/v1, or a test server (--endpoint).
	Endpoint string
	// SlotsPerHost, when positive, is every host's slot count; 0 takes the profile's GPU
	// count (--slots-per-host).
	SlotsPerHost int
	// MinInterval is the least time between two polls that call the API; a poll sooner than
	// that returns the last poll's result, or its error. 0 means DefaultMinInterval.
	MinInterval time.Duration
	// MaxBackoff caps how long the provider waits for a throttled or failing endpoint.
	// 0 means DefaultMaxBackoff.
	MaxBackoff time.Duration
	// Authenticator, when set, replaces the default credential chain (see New). Tests use
	// &core.NoAuthAuthenticator{}.
	Authenticator core.Authenticator
	// Logger receives throttling and hosts that start leaving; nil discards.
	Logger *slog.Logger
}

// regionRE is the shape of an IBM Cloud region name (us-south, eu-de, jp-tok, ca-mon).
var regionRE = regexp.MustCompile(`^[a-z]{2}-[a-z]{2,10}$`)

// Validate reports the first invalid field, naming its flag.
func (c Config) Validate() error {
	switch {
	case strings.TrimSpace(c.InstanceGroup) == "":
		return errors.New("--instance-group is required: the IBM Cloud VPC instance group's name or ID")
	case c.Region == "" && c.Endpoint == "":
		return errors.New("--region is required (e.g. us-south), or --endpoint with the VPC API URL")
	case c.Region != "" && !regionRE.MatchString(c.Region):
		return fmt.Errorf("--region %q: not an IBM Cloud region name such as us-south, eu-de or jp-tok", c.Region)
	case c.SlotsPerHost < 0 || c.SlotsPerHost > providers.MaxSlots:
		return fmt.Errorf("--slots-per-host %d: must be between 1 and %d (0 for the profile's GPU count)", c.SlotsPerHost, providers.MaxSlots)
	case c.MinInterval < 0:
		return fmt.Errorf("ibm MinInterval %v: must not be negative (0 for %v)", c.MinInterval, DefaultMinInterval)
	case c.MaxBackoff < 0:
		return fmt.Errorf("ibm MaxBackoff %v: must not be negative (0 for %v)", c.MaxBackoff, DefaultMaxBackoff)
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fmt.Errorf("--endpoint %q: want the VPC API base URL, e.g. https://us-south.private.iaas.cloud.ibm.com/v1", c.Endpoint)
		}
	}
	return nil
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	c.InstanceGroup = strings.TrimSpace(c.InstanceGroup)
	if c.MinInterval == 0 {
		c.MinInterval = DefaultMinInterval
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	return c
}

// serviceURL is the VPC API base URL: Endpoint, else the region's public endpoint.
func (c Config) serviceURL() string {
	if c.Endpoint != "" {
		return strings.TrimRight(c.Endpoint, "/")
	}
	if u, err := vpcv1.GetServiceURLForRegion(c.Region); err == nil {
		return u
	}
	// A region newer than the SDK's table follows the same pattern.
	return "https://" + c.Region + ".iaas.cloud.ibm.com/v1"
}

// where names the API location in messages: the region, the endpoint, or both.
func (c Config) where() string {
	switch {
	case c.Endpoint == "":
		return "region " + c.Region
	case c.Region == "":
		return "endpoint " + c.Endpoint
	default:
		return "region " + c.Region + " at " + c.Endpoint
	}
}

// apiKeyVars are the environment variables that may hold an IAM API key, in the order read;
// they are the names the ibmcloud CLI and the Terraform provider use.
var apiKeyVars = []string{"IBMCLOUD_API_KEY", "IC_API_KEY"}

// errNoCredentials says what to set when no credential source has anything.
var errNoCredentials = errors.New("no IBM Cloud credentials found: set IBMCLOUD_API_KEY to an IAM API key " +
	"(or VPC_AUTH_TYPE=vpc with VPC_IAM_PROFILE_ID on an instance with a trusted profile, " +
	"or VPC_APIKEY, or an ibm-credentials.env file); the key needs the Viewer role on VPC Infrastructure Services")

// authenticator picks the credentials: cfg.Authenticator; else the SDK's external
// configuration for the "vpc" service (ibm-credentials.env, VPC_AUTH_TYPE, VPC_APIKEY,
// VPC_IAM_PROFILE_ID, VPC_AUTH_URL…); else an IAM API key from IBMCLOUD_API_KEY or
// IC_API_KEY. Nothing here touches the network: tokens are fetched on the first request.
func authenticator(cfg Config) (core.Authenticator, error) {
	if cfg.Authenticator != nil {
		return cfg.Authenticator, nil
	}
	// The SDK counts any VPC_* variable as configuration (VPC_ID, say, set by a script), and
	// then guesses an authenticator that fails; so it is asked only when an auth property is
	// actually there.
	props, _ := core.GetServiceProperties(vpcv1.DefaultServiceName)
	if props["AUTH_TYPE"] != "" || props["AUTHTYPE"] != "" || props["APIKEY"] != "" {
		a, err := core.GetAuthenticatorFromEnvironment(vpcv1.DefaultServiceName)
		if err != nil {
			return nil, fmt.Errorf("credentials from the VPC_* variables or ibm-credentials.env: %v", err)
		}
		if a != nil {
			return a, nil
		}
	}
	for _, name := range apiKeyVars {
		key := strings.TrimSpace(os.Getenv(name))
		if key == "" {
			continue
		}
		a, err := core.NewIamAuthenticatorBuilder().SetApiKey(key).Build()
		if err != nil {
			return nil, fmt.Errorf("the API key in %s: %v", name, err)
		}
		return a, nil
	}
	return nil, errNoCredentials
}
