package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// Client calls the admin API of a running driver: requests signed with the admin secret,
// answers checked to be signed with it.
type Client struct {
	base string
	auth *protocol.Auth
	hc   *http.Client
}

// Refused is a driver's signed refusal (4xx, 5xx): Msg is its one-line reason.
type Refused struct {
	Code int
	Msg  string
}

func (e *Refused) Error() string { return e.Msg }

// NewClient returns a client of the driver at baseURL (its --listen address, e.g.
// http://127.0.0.1:29400) keyed by the admin secret. hc nil: a client with a 15 s timeout.
func NewClient(baseURL string, secret []byte, hc *http.Client) (*Client, error) {
	auth, err := protocol.NewAuth(secret, Label, 0)
	if err != nil {
		return nil, fmt.Errorf("admin secret: %w", err)
	}
	if hc == nil {
		hc = &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{Proxy: nil}}
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), auth: auth, hc: hc}, nil
}

// AddHost adds a host by address (slots 0: a stopped host's own count, else 1), or brings a
// stopped host back.
func (c *Client) AddHost(ctx context.Context, host string, slots int) (Change, error) {
	var ch Change
	err := c.do(ctx, http.MethodPost, PathHosts, AddRequest{Host: host, Slots: slots}, &ch)
	return ch, err
}

// RemoveHost removes a host by ID or address; force allows going below --min-np.
func (c *Client) RemoveHost(ctx context.Context, id string, force bool) (Change, error) {
	target := PathHosts + "/" + url.PathEscape(id)
	if force {
		target += "?force=1"
	}
	var ch Change
	err := c.do(ctx, http.MethodDelete, target, nil, &ch)
	return ch, err
}

// Stop ends the job, saying why.
func (c *Client) Stop(ctx context.Context, reason string) (StopAnswer, error) {
	var out StopAnswer
	err := c.do(ctx, http.MethodPost, PathStop, StopRequest{Reason: reason}, &out)
	return out, err
}

// Status returns the job's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	err := c.do(ctx, http.MethodGet, PathStatus, nil, &s)
	return s, err
}

func (c *Client) do(ctx context.Context, method, target string, in, out any) error {
	r, err := c.auth.Exchange(ctx, c.hc, method, c.base+target, in, 16<<20)
	// A driver that has just started refuses requests stamped before its start second: with
	// this host's clock behind its own, sign again each second until the gap has passed. The
	// request was refused unread, so sending it again cannot apply it twice.
	for first := time.Now(); ; {
		ue, ok := errors.AsType[*protocol.UnsignedError](err)
		if !ok || ue.Status != http.StatusUnauthorized || !protocol.SignedBeforeStart(ue.Reason) || time.Since(first) >= protocol.DefaultReplayWindow {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the driver refused the request as %s, until %w", ue.Reason, ctx.Err())
		case <-time.After(time.Second):
		}
		r, err = c.auth.Exchange(ctx, c.hc, method, c.base+target, in, 16<<20)
	}
	if ue, ok := errors.AsType[*protocol.UnsignedError](err); ok {
		switch ue.Status {
		case http.StatusUnauthorized:
			return fmt.Errorf("the driver refused the request's signature (%s): check that --admin-secret-file holds the secret the driver was started with, and that the clocks agree within 60s", ue.Reason)
		case http.StatusNotFound:
			return fmt.Errorf("%s answered 404 (%s): is this the driver's URL, and was it started with --admin-secret-file?", c.base, ue.Reason)
		}
		return fmt.Errorf("%s answered %d without a signature (%s): not an elasticd driver's admin API?", c.base, ue.Status, ue.Reason)
	}
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return fmt.Errorf("driver unreachable at %s: %w", c.base, ue)
	}
	if err != nil {
		return err
	}
	if r.Status == http.StatusServiceUnavailable && strings.Contains(r.Reason, ReasonNotDiscovered) {
		// A driver that has just started: its first discovery poll answers within moments.
		select {
		case <-ctx.Done():
			return &Refused{Code: r.Status, Msg: r.Reason}
		case <-time.After(time.Second):
		}
		return c.do(ctx, method, target, in, out)
	}
	if r.Status != http.StatusOK {
		return &Refused{Code: r.Status, Msg: r.Reason}
	}
	if err := json.Unmarshal(r.Body, out); err != nil {
		return fmt.Errorf("%s %s: malformed answer: %w", method, target, err)
	}
	return nil
}
