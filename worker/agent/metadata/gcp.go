package metadata

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/elasticd/elasticd/providers"
)

const (
	gcpDefaultBase      = "http://metadata.google.internal"
	gcpIDPath           = "/computeMetadata/v1/instance/id"
	gcpPreemptedPath    = "/computeMetadata/v1/instance/preempted"
	gcpMaintenancePath  = "/computeMetadata/v1/instance/maintenance-event"
	gcpPreemptionNotice = 30 * time.Second
	// gcpWaitSlack is kept between the server's timeout_sec and the context's deadline so
	// the server's answer arrives before the context ends.
	gcpWaitSlack = time.Second
)

// GCP watches Compute Engine's metadata server for a preemption (spot or preemptible VM)
// and a terminating host maintenance of this instance. It is safe for concurrent use.
type GCP struct {
	cfg Config

	id identity

	mu   sync.Mutex // guards etag, never held across a request
	etag string     // of instance/preempted when the last poll read FALSE; else ""
}

// NewGCP returns the metadata-server watcher; it makes no call.
func NewGCP(cfg Config) (*GCP, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	max := cfg.MaxWait
	if max == 0 {
		max = DefaultMaxWait
	}
	return &GCP{cfg: cfg.withDefaults(gcpDefaultBase, max+DefaultTimeout)}, nil
}

// InstanceID is this instance's numeric ID, asked once and then remembered.
func (g *GCP) InstanceID(ctx context.Context) (string, error) {
	return g.id.get(ctx, "gcp metadata: instance ID", "want a numeric instance ID",
		func(ctx context.Context) (*http.Request, answer, error) { return g.get(ctx, gcpIDPath, nil) },
		func(id string) bool { _, err := strconv.ParseUint(id, 10, 64); return err == nil })
}

// Notices reads instance/maintenance-event, then instance/preempted. When neither announces
// anything and the last poll read preempted FALSE, it waits on preempted for a change
// (wait_for_change with the last ETag), at most MaxWait and never past the context's
// deadline less a second; a context that ends earlier ends the wait. So a watcher calling
// Notices in a loop learns of a preemption within a round trip, and of a maintenance event
// within one wait (GPU VMs get an hour's notice of those). An endpoint that fails does not
// hide the other's notice: it is returned with the error.
func (g *GCP) Notices(ctx context.Context) ([]providers.Notice, error) {
	host, err := g.InstanceID(ctx)
	if err != nil {
		return nil, err
	}
	var notices []providers.Notice
	var errs []error
	n, err := g.maintenance(ctx, host)
	if err != nil {
		errs = append(errs, fmt.Errorf("gcp metadata: %w", err))
	} else if n != nil {
		notices = append(notices, *n)
	}
	// A preemption is still looked for when maintenance-event could not be read, but not
	// waited for: the caller should hear of that error now.
	if ctx.Err() == nil {
		n, err = g.preempted(ctx, host, len(notices) == 0 && err == nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("gcp metadata: %w", err))
		} else if n != nil {
			notices = append(notices, *n)
		}
	}
	return notices, errors.Join(errs...)
}

func (g *GCP) maintenance(ctx context.Context, host string) (*providers.Notice, error) {
	req, ans, err := g.get(ctx, gcpMaintenancePath, nil)
	if err != nil {
		return nil, err
	}
	v := strings.TrimSpace(string(ans.body))
	if ans.status != http.StatusOK {
		return nil, unexpected(req, ans, "want 200")
	}
	switch v {
	case "NONE", "MIGRATE_ON_HOST_MAINTENANCE":
		// A live migration keeps the VM (and its workers) running.
		return nil, nil
	case "TERMINATE_ON_HOST_MAINTENANCE":
		return &providers.Notice{
			ID:     bodyID("gcp", host, gcpMaintenancePath, ans.body),
			HostID: host,
			Kind:   providers.Maintenance,
			Detail: "Compute Engine host maintenance " + v,
		}, nil
	}
	return nil, unexpected(req, ans, "want NONE, MIGRATE_ON_HOST_MAINTENANCE or TERMINATE_ON_HOST_MAINTENANCE")
}

func (g *GCP) preempted(ctx context.Context, host string, mayWait bool) (*providers.Notice, error) {
	g.mu.Lock()
	etag := g.etag
	g.mu.Unlock()
	var q url.Values
	if wait := g.wait(ctx); mayWait && etag != "" && wait > 0 {
		q = url.Values{
			"wait_for_change": {"true"},
			"last_etag":       {etag},
			"timeout_sec":     {strconv.Itoa(int(wait / time.Second))},
		}
	}
	req, ans, err := g.get(ctx, gcpPreemptedPath, q)
	if err != nil {
		return nil, err
	}
	if ans.status != http.StatusOK {
		return nil, unexpected(req, ans, "want 200")
	}
	v := strings.TrimSpace(string(ans.body))
	// Only a FALSE is worth waiting on: TRUE stays TRUE until the VM is gone, and a wait on
	// it would hold every later poll for the whole wait.
	g.mu.Lock()
	g.etag = ""
	if v == "FALSE" {
		g.etag = ans.header.Get("ETag")
	}
	g.mu.Unlock()
	switch v {
	case "FALSE":
		return nil, nil
	case "TRUE":
		return &providers.Notice{
			ID:       bodyID("gcp", host, gcpPreemptedPath, []byte("TRUE")),
			HostID:   host,
			Kind:     providers.Interruption,
			Deadline: g.cfg.Now().Add(gcpPreemptionNotice),
			Detail:   "Compute Engine preemption",
		}, nil
	}
	return nil, unexpected(req, ans, "want TRUE or FALSE")
}

// wait is how long the server may hold a wait_for_change request, in whole seconds; 0: do
// not wait.
func (g *GCP) wait(ctx context.Context) time.Duration {
	w := g.cfg.MaxWait
	if dl, ok := ctx.Deadline(); ok {
		w = min(w, time.Until(dl)-gcpWaitSlack)
	}
	return w.Truncate(time.Second)
}

func (g *GCP) get(ctx context.Context, path string, q url.Values) (*http.Request, answer, error) {
	u := g.cfg.BaseURL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, answer{}, err
	}
	req.Header.Set("Metadata-Flavor", "Google")
	ans, err := do(g.cfg.Client, req)
	if err != nil {
		return req, answer{}, err
	}
	// The real server says who it is; anything else (a captive portal, a proxy) is not it.
	if f := ans.header.Get("Metadata-Flavor"); ans.status == http.StatusOK && f != "Google" {
		return req, answer{}, unexpected(req, ans, "answer lacks the header Metadata-Flavor: Google")
	}
	return req, ans, nil
}
