// Package gcp discovers the hosts of a Google Compute Engine managed instance group (MIG),
// zonal or regional, and steers its size, through the Compute Engine REST API: one answer per
// call, no goroutines.
package gcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/throttle"
	"google.golang.org/api/option"
)

// DefaultMinInterval is how long a poll's result is reused when Config.MinInterval is zero.
// The driver polls every second; the Compute Engine read quota is shared with everything
// else in the project, so the API is asked at most once per interval.
const DefaultMinInterval = 5 * time.Second

// Config says which group to list and how. Zero values take the documented defaults.
type Config struct {
	// Project is the Google Cloud project ID (--project). Required.
	Project string
	// Zone is the zone of a zonal MIG (--zone); Region the region of a regional MIG
	// (--region). Exactly one of them.
	Zone   string
	Region string
	// MIG is the managed instance group's name (--mig). Required.
	MIG string
	// Endpoint overrides the API root, e.g. https://compute.googleapis.com or a Private Service
	// Connect endpoint (--endpoint); the SDK appends /compute/v1/…. Empty: the SDK's default.
	Endpoint string
	// SlotsPerHost, when positive, is every host's slot count (--slots-per-host); zero means the
	// instance's GPU count (its guestAccelerators, else the machine type's, see gpus.go), else 1.
	SlotsPerHost int
	// MinInterval: a poll sooner than this after the start of the last API poll returns that
	// poll's hosts without calling the API (0: DefaultMinInterval).
	MinInterval time.Duration
	// Logger receives throttling and skipped-instance reports; nil discards them.
	Logger *slog.Logger
	// ClientOptions are given to the SDK clients after the provider's own: a credentials file,
	// an HTTP client, option.WithoutAuthentication() against a test server. Empty: Application
	// Default Credentials.
	ClientOptions []option.ClientOption
}

var (
	// nameRE is a GCE resource name (MIG, zone, region): RFC 1035 label, lower case.
	nameRE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
	// projectRE is a project ID, including the legacy domain-scoped form "example.com:proj".
	projectRE = regexp.MustCompile(`^([a-z0-9][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$`)
)

// Validate reports the first thing wrong with c, naming the flag to fix.
func (c Config) Validate() error {
	switch {
	case c.Project == "":
		return errors.New("--project is required: the Google Cloud project of the MIG")
	case !projectRE.MatchString(c.Project):
		return fmt.Errorf("--project %q is not a project ID (6-30 lower-case letters, digits and hyphens, e.g. my-project-123)", c.Project)
	case c.MIG == "":
		return errors.New("--mig is required: the managed instance group's name")
	case !nameRE.MatchString(c.MIG):
		return fmt.Errorf("--mig %q is not a MIG name (lower-case letters, digits and hyphens, starting with a letter)", c.MIG)
	case c.Zone != "" && c.Region != "":
		return fmt.Errorf("--zone %q and --region %q: give one, --zone for a zonal MIG or --region for a regional MIG", c.Zone, c.Region)
	case c.Zone == "" && c.Region == "":
		return errors.New("--zone or --region is required: --zone for a zonal MIG (e.g. us-central1-a), --region for a regional MIG (e.g. us-central1)")
	case c.Zone != "" && !nameRE.MatchString(c.Zone):
		return fmt.Errorf("--zone %q is not a zone name (e.g. us-central1-a)", c.Zone)
	case c.Region != "" && !nameRE.MatchString(c.Region):
		return fmt.Errorf("--region %q is not a region name (e.g. us-central1)", c.Region)
	case c.SlotsPerHost < 0 || c.SlotsPerHost > providers.MaxSlots:
		return fmt.Errorf("--slots-per-host %d: must be between 1 and %d (0: the GPU count)", c.SlotsPerHost, providers.MaxSlots)
	case c.MinInterval < 0:
		return fmt.Errorf("minimum refresh interval %v: must not be negative (0: %v)", c.MinInterval, DefaultMinInterval)
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return fmt.Errorf("--endpoint %q: want an http(s) URL such as https://compute.googleapis.com", c.Endpoint)
		}
	}
	return nil
}

// Provider lists the hosts of one MIG. It is safe for concurrent use: polls take turns, and
// one that waits its turn returns the result the previous one just fetched.
type Provider struct {
	cfg   Config
	log   *slog.Logger
	where string // `MIG "m" (project "p", zone "z")`, after the "gcp: " of every error

	// loop is the portable part: one poll at a time, the reuse of hosts within
	// MinInterval, each endpoint's gate and retries (throttle.go), the "gcp: " prefix.
	loop *providers.Loop

	// apiTurn is held while the SDK clients are used or closed; waiting for it honours the
	// context. It guards api.
	apiTurn chan struct{}
	api     computeAPI // nil until the first poll makes it
}

// driver is the cloud's own part of the provider, under the loop: its SDK calls.
type driver struct{ p *Provider }

// New checks cfg and returns a provider. It does not touch the network: the SDK clients, and
// with them the credentials, are made by the first poll.
func New(cfg Config) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = DefaultMinInterval
	}
	cfg.Endpoint = strings.TrimRight(cfg.Endpoint, "/")
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	loc := "zone " + fmt.Sprintf("%q", cfg.Zone)
	if cfg.Region != "" {
		loc = "region " + fmt.Sprintf("%q", cfg.Region)
	}
	p := &Provider{
		cfg:     cfg,
		log:     log.With("provider", "gcp"),
		where:   fmt.Sprintf("MIG %q (project %q, %s)", cfg.MIG, cfg.Project, loc),
		apiTurn: make(chan struct{}, 1),
	}
	p.loop = providers.NewLoop(providers.LoopConfig{
		Name: "gcp", Where: func() string { return p.where }, MinInterval: cfg.MinInterval,
		Tries: throttle.Tries, Throttled: ErrThrottled, Logger: p.log,
	}, driver{p})
	return p, nil
}

// Hosts lists the group's instances that have an internal IP: RUNNING ones, and those the
// cloud is taking away (Leaving; see leaving). Within MinInterval of the last API poll it
// returns that poll's hosts without calling the API. The result belongs to the caller.
func (p *Provider) Hosts(ctx context.Context) ([]providers.Host, error) {
	return p.loop.Hosts(ctx)
}

// ListHosts is one poll of the API.
func (d driver) ListHosts(ctx context.Context) ([]providers.Host, error) {
	select {
	case d.p.apiTurn <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-d.p.apiTurn }()
	return d.p.poll(ctx)
}

// Close releases the SDK clients' connections. A poll after Close makes new clients.
func (p *Provider) Close() error {
	p.apiTurn <- struct{}{}
	defer func() { <-p.apiTurn }()
	if p.api == nil {
		return nil
	}
	err := p.api.Close()
	p.api = nil
	return err
}
