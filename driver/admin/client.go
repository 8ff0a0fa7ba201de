package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
)

// Client calls the admin API of a running driver: requests signed with the admin secret,
// answers checked to be signed with it.
type Client struct {
	base string
	auth *rendezvous.Auth
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
	auth, err := rendezvous.NewAuth(secret, Label, 0)
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

// Status returns the job's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	err := c.do(ctx, http.MethodGet, PathStatus, nil, &s)
	return s, err
}

func (c *Client) do(ctx context.Context, method, target string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+target, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("driver URL %q: %w", c.base, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	nonce := c.auth.Sign(req, body)
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("driver unreachable at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read the driver's answer: %w", err)
	}
	msg := strings.TrimSpace(string(data))
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	if resp.Header.Get(rendezvous.HeaderAnswerSignature) == "" {
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			return fmt.Errorf("the driver refused the request's signature (%s): check that --admin-secret-file holds the secret the driver was started with, and that the clocks agree within 60s", msg)
		case http.StatusNotFound:
			return fmt.Errorf("%s answered 404 (%s): is this the driver's URL, and was it started with --admin-secret-file?", c.base, msg)
		}
		return fmt.Errorf("%s answered %d without a signature (%s): not an elasticd driver's admin API?", c.base, resp.StatusCode, msg)
	}
	if err := c.auth.VerifyAnswer(resp.Header, nonce, resp.StatusCode, data); err != nil {
		return fmt.Errorf("%s %s: %w", method, target, err)
	}
	if resp.StatusCode != http.StatusOK {
		return &Refused{Code: resp.StatusCode, Msg: msg}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: malformed answer: %w", method, target, err)
	}
	return nil
}
