// Package throttle paces a cloud provider's calls per API endpoint: a gate per endpoint that
// honours Retry-After (capped), otherwise a bounded backoff that grows on throttling and
// decays on success, and that a poll waits out only when the wait fits its deadline.
package throttle

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrThrottled is wrapped by the error of a call that was not made because its endpoint
// rests longer than the caller may wait. Each provider wraps its own sentinel around it.
var ErrThrottled = errors.New("throttled")

// Defaults of Config: one set for every cloud.
const (
	// DefaultBase is the backoff after a first failure; each further failure doubles it…
	DefaultBase = time.Second
	// …up to DefaultMax, and each success halves it, back to zero.
	DefaultMax = 30 * time.Second
	// DefaultMaxRetryAfter caps a server's Retry-After: one odd header must not stop
	// discovery for an hour.
	DefaultMaxRetryAfter = 2 * time.Minute
	// DefaultMaxWait is the longest a call waits for a gate inside one poll…
	DefaultMaxWait = 10 * time.Second
	// …and DefaultMargin what the wait must leave of the poll before its deadline.
	DefaultMargin = 500 * time.Millisecond
	// Tries bounds the requests for one call within one poll.
	Tries = 3
)

// maxRetryAfterSeconds keeps a parsed Retry-After from overflowing; any cap is far below it.
const maxRetryAfterSeconds = 86400

// Config tunes Gates. The zero value of each field takes its default.
type Config struct {
	Base          time.Duration // first backoff
	Max           time.Duration // cap of the backoff
	MaxRetryAfter time.Duration // cap of a server's Retry-After
	MaxWait       time.Duration // longest wait for a gate inside one poll
	Margin        time.Duration // what a wait must leave of the poll
	// Jitter draws each backoff between half and all of it, so that many clients throttled
	// together do not come back together. A Retry-After is never jittered.
	Jitter bool

	// Now and After are the clock, for tests; nil: the real one.
	Now   func() time.Time
	After func(time.Duration) <-chan time.Time
}

// Gates is the throttling state of one provider's endpoints, keyed by endpoint name. Each
// endpoint has its own, so that a throttled listing holds back no other. The state of an
// endpoint is a level bounded by the cap, never a count that grows without bound (see
// seeds/001). Safe for concurrent use.
type Gates struct {
	cfg      Config
	maxLevel int

	mu    sync.Mutex
	gates map[string]*gate
}

// gate is one endpoint's state.
type gate struct {
	level     int       // 0…maxLevel: up one per failure, down one per success
	notBefore time.Time // no call before this
	why       error     // the failure that set notBefore
}

// New makes the gates of one provider.
func New(cfg Config) *Gates {
	if cfg.Base <= 0 {
		cfg.Base = DefaultBase
	}
	if cfg.Max <= 0 {
		cfg.Max = DefaultMax
	}
	cfg.Base = min(cfg.Base, cfg.Max)
	if cfg.MaxRetryAfter <= 0 {
		cfg.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.Margin <= 0 {
		cfg.Margin = DefaultMargin
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	g := &Gates{cfg: cfg, gates: make(map[string]*gate)}
	for g.cfg.Base<<g.maxLevel < g.cfg.Max && g.maxLevel < 62 {
		g.maxLevel++
	}
	return g
}

// get is ep's gate; g.mu is held.
func (g *Gates) get(ep string) *gate {
	s := g.gates[ep]
	if s == nil {
		s = &gate{}
		g.gates[ep] = s
	}
	return s
}

// Throttled records that ep throttled a call (or failed it transiently) and returns how long
// ep now rests: retryAfter when the server named one (capped), else the backoff. A negative
// retryAfter means the server named none. why is kept for the errors of calls not made.
func (g *Gates) Throttled(ep string, retryAfter time.Duration, why error) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.get(ep)
	wait := min(g.cfg.Base<<s.level, g.cfg.Max)
	s.level = min(s.level+1, g.maxLevel)
	switch {
	case retryAfter >= 0:
		wait = min(retryAfter, g.cfg.MaxRetryAfter)
	case g.cfg.Jitter:
		wait = wait/2 + rand.N(wait/2+1)
	}
	s.notBefore, s.why = g.cfg.Now().Add(wait), why
	return wait
}

// Succeeded records a successful call: ep's backoff decays one step and its gate opens.
func (g *Gates) Succeeded(ep string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.get(ep)
	s.level = max(s.level-1, 0)
	s.notBefore, s.why = time.Time{}, nil
}

// Until is when ep's gate opens; the zero time when it is open.
func (g *Gates) Until(ep string) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.get(ep).notBefore
}

// Open is nil when ep may be called now, else an *Error: for a caller that never waits.
func (g *Gates) Open(ep string) error {
	_, err := g.check(ep, func(time.Duration) bool { return false })
	return err
}

// Ready is nil when ep may be called now or its rest fits in ctx (Wait would wait it out),
// else an *Error. It does not wait: a poll checks every endpoint it needs before it calls any.
func (g *Gates) Ready(ctx context.Context, ep string) error {
	_, err := g.check(ep, g.fits(ctx))
	return err
}

// Wait blocks until ep may be called. When ep rests longer than ctx may wait (past
// MaxWait, or leaving less than Margin before ctx's deadline) it does not wait: it returns
// an *Error at once. It returns ctx's error when ctx ends first.
func (g *Gates) Wait(ctx context.Context, ep string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := g.check(ep, g.fits(ctx))
	if err != nil || d <= 0 {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-g.cfg.After(d):
		return nil
	}
}

// check is how long ep still rests, or an *Error when fits says that is too long.
func (g *Gates) check(ep string, fits func(time.Duration) bool) (time.Duration, error) {
	g.mu.Lock()
	s := g.get(ep)
	until, why := s.notBefore, s.why
	g.mu.Unlock()
	d := until.Sub(g.cfg.Now())
	if d <= 0 {
		return 0, nil
	}
	if !fits(d) {
		return d, &Error{Endpoint: ep, Wait: d, Until: until, Cause: why}
	}
	return d, nil
}

// fits reports whether a wait of d is one ctx may spend.
func (g *Gates) fits(ctx context.Context) func(time.Duration) bool {
	return func(d time.Duration) bool {
		if d > g.cfg.MaxWait {
			return false
		}
		dl, ok := ctx.Deadline()
		return !ok || dl.Sub(g.cfg.Now()) >= d+g.cfg.Margin
	}
}

// Error is a call not made because its endpoint rests longer than the caller may wait.
type Error struct {
	Endpoint string
	Wait     time.Duration // how much longer the endpoint rests
	Until    time.Time     // when it opens
	Cause    error         // the failure that closed it, if known
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s is resting for another %v (until %s), longer than this poll may wait",
		e.Endpoint, e.Wait.Round(time.Millisecond), e.Until.UTC().Format(time.RFC3339))
	if e.Cause != nil {
		s += ", after: " + e.Cause.Error()
	}
	return s
}

// Is makes an *Error match ErrThrottled.
func (e *Error) Is(target error) bool { return target == ErrThrottled }

// Unwrap is the failure that closed the endpoint.
func (e *Error) Unwrap() error { return e.Cause }

// ParseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3): delay-seconds, also with a
// fraction, or an HTTP date (a past one is no wait). ok is false when v is empty or
// unreadable. A huge value is clamped to a day: Gates caps it further.
func ParseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 || s != s { // negative or NaN
			return 0, false
		}
		return time.Duration(min(s, maxRetryAfterSeconds) * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), maxRetryAfterSeconds*time.Second), true
	}
	return 0, false
}
