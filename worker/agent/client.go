package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// client sends signed requests to the driver and checks that the answers are signed.
type client struct {
	base string
	auth *protocol.Auth
	hc   *http.Client
}

const (
	requestTimeout = 15 * time.Second
	maxAnswer      = 16 << 20
)

func newClient(base string, auth *protocol.Auth, hc *http.Client) *client {
	return &client{base: strings.TrimRight(base, "/"), auth: auth, hc: hc}
}

// driverClient is an HTTP client for the driver at base, without proxy (the driver is on the
// cluster's own network) or redirects. With session, the agent's session (commands, events,
// the watch and its workers' relayed requests) shares one connection: its session stream
// (StreamTransport, opened with auth's signature) on plain http, else HTTP/2 (with prior
// knowledge on plain http, for a driver without streams). Without, HTTP/1.1: the
// registration, which a driver of an older release must be able to read and refuse in words.
func driverClient(base string, auth *protocol.Auth, session bool) *http.Client {
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: 0, // long-polls: each request has its own deadline
		Protocols:             new(http.Protocols),
	}
	switch {
	case !session:
		tr.Protocols.SetHTTP1(true)
	case strings.HasPrefix(base, "https:"):
		tr.Protocols.SetHTTP2(true)
	default:
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	// A connection that went quiet (the driver's machine gone without a FIN) is found by a
	// ping rather than by the requests' own deadlines.
	tr.HTTP2 = &http.HTTP2Config{SendPingTimeout: 10 * time.Second, PingTimeout: 10 * time.Second}
	var rt http.RoundTripper = tr
	if u, err := url.Parse(base); err == nil && session && u.Scheme == "http" {
		rt = &StreamTransport{Driver: u, Auth: auth, Fallback: tr}
	}
	return &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// errRefused is a 401: the driver did not accept our signature.
type errRefused struct{ reason string }

func (e *errRefused) Error() string {
	return "the driver refused the agent's signature (" + e.reason + "): check that --agent-secret-file holds the same secret as the driver's, and that the clocks agree within 60s"
}

// statusError is an answer other than the one expected.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return fmt.Sprintf("driver answered %d: %s", e.code, e.msg) }

func isStatus(err error, code int) bool {
	se, ok := errors.AsType[*statusError](err)
	return ok && se.code == code
}

// do sends one signed request; in (may be nil) is JSON-encoded and out (may be nil) decoded
// from a 200 answer. wait is added to the request's deadline for long-polls.
func (c *client) do(ctx context.Context, method, target string, in, out any, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout+wait)
	defer cancel()
	r, err := c.auth.Exchange(ctx, c.hc, method, c.base+target, in, maxAnswer)
	if ue, ok := errors.AsType[*protocol.UnsignedError](err); ok {
		if ue.Status == http.StatusUnauthorized {
			return &errRefused{reason: ue.Reason}
		}
		return fmt.Errorf("%s %s: answer %d (%s) not signed by the driver: is --driver the driver's URL, with the same --agent-secret-file?", method, target, ue.Status, ue.Reason)
	}
	if err != nil {
		return err
	}
	switch {
	case r.Status == http.StatusOK && out != nil:
		if err := json.Unmarshal(r.Body, out); err != nil {
			return fmt.Errorf("%s %s: malformed answer: %w", method, target, err)
		}
	case r.Status >= 300:
		return &statusError{code: r.Status, msg: r.Reason}
	}
	return nil
}
