// Package metadata holds the on-host interruption watchers of the elasticd agent: each asks
// its cloud's instance metadata service, one poll per call, whether this host is going away.
package metadata

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

const (
	// DefaultTimeout bounds one request to the metadata service when the caller's context
	// does not; link-local services answer in milliseconds or not at all.
	DefaultTimeout = 5 * time.Second
	// DefaultMaxWait is the longest a GCP poll blocks waiting for a change when the context
	// has no deadline.
	DefaultMaxWait = 60 * time.Second
	// DefaultTokenTTL is the lifetime asked for an IMDSv2 session token (NTH asks for an hour).
	DefaultTokenTTL = time.Hour

	// maxBody is the most read from one answer: every document here is a few hundred bytes.
	maxBody = 1 << 20
	// quoteLen is how much of an unexpected answer an error repeats.
	quoteLen = 120
)

// Config is shared by the three watchers; each uses the fields it needs.
type Config struct {
	// BaseURL overrides the metadata service's address (scheme and host, e.g. a test server).
	// Empty: the cloud's own (http://169.254.169.254 or http://metadata.google.internal).
	BaseURL string
	// Client sends the requests. Nil: a client that never uses a proxy (HTTP_PROXY must not
	// capture link-local traffic) and gives each request DefaultTimeout, or DefaultMaxWait
	// plus DefaultTimeout for GCP's waits. A client given here must allow GCP's waits
	// (MaxWait) too.
	Client *http.Client
	// TokenTTL is the IMDSv2 token lifetime asked for (AWS only; 1 s to 6 h). 0: DefaultTokenTTL.
	TokenTTL time.Duration
	// MaxWait caps how long a GCP poll waits for a change (0: DefaultMaxWait); the context's
	// deadline caps it too.
	MaxWait time.Duration
	// Logger receives what is skipped and why (debug); nil discards.
	Logger *slog.Logger
	// Now is the clock (token expiry, GCP's deadline); nil: time.Now. Tests set it.
	Now func() time.Time
}

// Validate reports the first invalid field. It makes no call.
func (c Config) Validate() error {
	if c.BaseURL != "" {
		u, err := url.Parse(c.BaseURL)
		switch {
		case err != nil:
			return fmt.Errorf("metadata base URL %q: not a URL", c.BaseURL)
		case u.Scheme != "http" && u.Scheme != "https":
			return fmt.Errorf("metadata base URL %q: want an absolute http(s) URL such as http://169.254.169.254", c.BaseURL)
		case u.Host == "":
			return fmt.Errorf("metadata base URL %q: no host", c.BaseURL)
		case u.RawQuery != "" || u.Fragment != "":
			return fmt.Errorf("metadata base URL %q: must not carry a query or fragment", c.BaseURL)
		}
	}
	switch {
	case c.TokenTTL < 0 || (c.TokenTTL > 0 && c.TokenTTL < time.Second) || c.TokenTTL > 6*time.Hour:
		return fmt.Errorf("IMDSv2 token TTL %v: must be between 1s and 6h (0: %v)", c.TokenTTL, DefaultTokenTTL)
	case c.MaxWait < 0:
		return fmt.Errorf("metadata max wait %v: must not be negative (0: %v)", c.MaxWait, DefaultMaxWait)
	}
	return nil
}

func (c Config) withDefaults(base string, clientTimeout time.Duration) Config {
	if c.BaseURL == "" {
		c.BaseURL = base
	}
	c.BaseURL = strings.TrimRight(c.BaseURL, "/")
	if c.Client == nil {
		c.Client = &http.Client{
			Timeout: clientTimeout,
			Transport: &http.Transport{
				Proxy:                 nil,
				DialContext:           (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
				MaxIdleConns:          4,
				IdleConnTimeout:       90 * time.Second,
				DisableCompression:    true,
				ResponseHeaderTimeout: clientTimeout,
			},
		}
	}
	if c.TokenTTL == 0 {
		c.TokenTTL = DefaultTokenTTL
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// answer is one response, read whole (up to maxBody).
type answer struct {
	status int
	header http.Header
	body   []byte
}

// do sends req (made with the caller's context) and reads the answer; the error names the
// method and URL once.
func do(client *http.Client, req *http.Request) (answer, error) {
	resp, err := client.Do(req)
	if err != nil {
		// url.Error already names the method and URL.
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: reading the answer: %w", req.Method, req.URL.Redacted(), err)
	}
	if len(body) > maxBody {
		return answer{}, fmt.Errorf("%s %s: answer longer than %d bytes", req.Method, req.URL.Redacted(), maxBody)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

// unexpected is the error for an answer this package does not understand.
func unexpected(req *http.Request, a answer, what string) error {
	return fmt.Errorf("%s %s: %s: HTTP %d %s", req.Method, req.URL.Redacted(), what, a.status, quote(a.body))
}

// quote repeats at most quoteLen bytes of an answer, safely for a log line.
func quote(b []byte) string {
	if len(b) <= quoteLen {
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("%q… (%d bytes)", b[:quoteLen], len(b))
}

// bodyID de-duplicates a notice the cloud gives no ID for: the same answer from the same
// endpoint about the same host is the same notice.
func bodyID(cloud, hostID, path string, body []byte) string {
	h := sha256.New()
	for _, s := range []string{cloud, hostID, path} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	h.Write(body)
	return cloud + ":" + hex.EncodeToString(h.Sum(nil)[:12])
}

// identity is this host's name in its cloud (instance ID, VM name), read once from the
// metadata service, checked, and then remembered: every watcher needs it for its notices.
type identity struct {
	mu sync.Mutex // never held across a request
	v  string
}

// get returns the remembered identity, or reads it with read and keeps it when valid
// accepts it; label and want make the errors say what was asked and what was expected.
func (c *identity) get(ctx context.Context, label, want string, read func(context.Context) (*http.Request, answer, error), valid func(string) bool) (string, error) {
	c.mu.Lock()
	v := c.v
	c.mu.Unlock()
	if v != "" {
		return v, nil
	}
	req, ans, err := read(ctx)
	if err != nil {
		return "", fmt.Errorf("%s: %w", label, err)
	}
	v = strings.TrimSpace(string(ans.body))
	if ans.status != http.StatusOK || !valid(v) {
		return "", fmt.Errorf("%s: %w", label, unexpected(req, ans, want))
	}
	c.mu.Lock()
	c.v = v
	c.mu.Unlock()
	return v, nil
}
