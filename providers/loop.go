package providers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/elasticd/elasticd/providers/throttle"
)

// A cloud provider is two parts, in the manner of go-cloud's portable types: a small Driver
// that is the cloud's own (its SDK calls and what their errors mean) and a Loop that is the
// same for every cloud. The Loop owns the pacing: one poll at a time, the reuse of an answer
// within MinInterval, a poll shared by the callers that waited for it, the retries of one
// request with a bounded backoff per endpoint, de-duplication within one answer, and the
// prefix of every error ("aws: …", "gcp: …").

// Driver lists a group's hosts: one answer per call, no waiting, caching or retrying of its
// own (each request goes through Loop.Call, which does those).
type Driver interface {
	// ListHosts asks the cloud once. Its error needs no prefix: the Loop adds it.
	ListHosts(ctx context.Context) ([]Host, error)
	// Classify says what a failed request means for pacing (see Verdict).
	Classify(err error) Verdict
}

// NoticeDriver is implemented by drivers whose cloud announces that hosts will go away.
type NoticeDriver interface {
	ListNotices(ctx context.Context) ([]Notice, error)
}

// AnswerDriver is implemented by drivers whose notices must be answered (an ASG lifecycle
// action). Answering a notice the cloud no longer holds open must not be an error.
type AnswerDriver interface {
	AnswerNotice(ctx context.Context, n Notice) error
}

// Verdict is what a failed request says about its endpoint.
type Verdict struct {
	// Rest: the endpoint is busy (a throttle, a transient failure): its gate closes for After,
	// or for its backoff when After is negative, and no request goes to it until then.
	Rest bool
	// Retry: the request may be made again within this poll once the gate opens, when the
	// wait fits the poll (Loop.Call makes LoopConfig.Tries requests at most). Retry implies
	// Rest.
	Retry bool
	// After is the server's Retry-After; negative when it named none.
	After time.Duration
}

// Permanent is the verdict on an error that no wait changes (a bad request, denied
// credentials): neither rest nor retry.
var Permanent = Verdict{After: -1}

// LoopConfig is what differs between clouds in the Loop.
type LoopConfig struct {
	// Name is the cloud ("aws", "gcp", "azure", "ibm"): every error starts with "Name: ".
	Name string
	// Where names the group after the prefix (`auto scaling group "g" in us-east-1`); nil or
	// "": the prefix alone. Called per error, so it may name what was resolved since.
	Where func() string
	// MinInterval: a Hosts call sooner than this after the start of the last poll that reached
	// the cloud returns that poll's answer without calling it. 0: every call polls.
	MinInterval time.Duration
	// KeepErrors makes a failed poll's error an answer reused within MinInterval too (a
	// cloud that counts failed requests against its quota); otherwise only successes are.
	KeepErrors bool
	// Tries bounds the requests of one Call (default throttle.Tries).
	Tries int
	// Throttled, when set, is the cloud's sentinel that Call wraps around the error of a
	// request the endpoint turned away (a Rest verdict) or that its rest kept from being made:
	// "endpoint: sentinel: what happened".
	Throttled error
	// Gates paces each endpoint after a Rest verdict (zero value: the throttle defaults).
	Gates throttle.Config
	// Logger receives retries; nil discards them.
	Logger *slog.Logger
	// Now is the clock of MinInterval, for tests; nil: time.Now.
	Now func() time.Time
}

// Loop is the portable provider: it implements Provider, and Noticer and NoticeCompleter
// when its driver can. Safe for concurrent use; it starts no goroutines.
type Loop struct {
	cfg   LoopConfig
	d     Driver
	log   *slog.Logger
	gates *throttle.Gates

	// hostsTurn and noticesTurn are held by the poll in progress of each kind; a caller
	// waits for its turn under its own context (a channel, unlike a mutex, can be given up on).
	hostsTurn, noticesTurn chan struct{}

	mu       sync.Mutex // guards what follows: small, never held across a call
	inflight bool       // a Hosts poll is calling the driver
	waiters  int        // callers waiting to share the poll in progress
	polls    uint64     // Hosts polls that ended (counted also when they failed)
	last     answer     // the last poll's answer; at is zero before the first
}

// answer is one Hosts poll's result.
type answer struct {
	hosts []Host
	err   error
	at    time.Time // when the poll started
}

// NewLoop makes the portable provider over d.
func NewLoop(cfg LoopConfig, d Driver) *Loop {
	if cfg.Tries <= 0 {
		cfg.Tries = throttle.Tries
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Loop{
		cfg: cfg, d: d, log: log, gates: throttle.New(cfg.Gates),
		hostsTurn: make(chan struct{}, 1), noticesTurn: make(chan struct{}, 1),
	}
}

// Errorf makes an error with the Loop's prefix: "name: where: " then format.
func (l *Loop) Errorf(format string, args ...any) error {
	return fmt.Errorf(l.prefix()+format, args...)
}

// wrap prefixes err, once.
func (l *Loop) wrap(err error) error {
	if err == nil {
		return nil
	}
	var pe *prefixed
	if errors.As(err, &pe) && pe.loop == l {
		return err
	}
	return &prefixed{loop: l, msg: l.prefix() + err.Error(), err: err}
}

func (l *Loop) prefix() string {
	p := l.cfg.Name + ": "
	if l.cfg.Where != nil {
		if w := l.cfg.Where(); w != "" {
			p += w + ": "
		}
	}
	return p
}

// prefixed is an error the Loop has prefixed, so that it is prefixed once.
type prefixed struct {
	loop *Loop
	msg  string
	err  error
}

func (e *prefixed) Error() string { return e.msg }
func (e *prefixed) Unwrap() error { return e.err }

// withCtx makes an error of a poll whose context ended wrap ctx's error too.
func withCtx(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (the poll's context: %w)", err, cerr)
	}
	return err
}

// take waits for turn under ctx; false when ctx ended first.
func take(ctx context.Context, turn chan struct{}) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case turn <- struct{}{}:
		if ctx.Err() != nil { // both were ready and select took the turn
			<-turn
			return false
		}
		return true
	case <-ctx.Done():
		return false
	}
}

// Hosts polls the driver, one poll at a time. A caller that waited for a poll in progress
// takes that poll's hosts; a call within MinInterval of the start of the last poll takes
// its answer (with KeepErrors, a failure too). The result belongs to the caller. A poll
// whose context ended keeps nothing: that says nothing about the group.
func (l *Loop) Hosts(ctx context.Context) ([]Host, error) {
	l.mu.Lock()
	waitFor := uint64(0) // the poll in progress, if any, that this caller may share
	if l.inflight {
		waitFor = l.polls + 1
		l.waiters++
	}
	l.mu.Unlock()
	ok := take(ctx, l.hostsTurn)
	if waitFor != 0 {
		l.mu.Lock()
		l.waiters--
		l.mu.Unlock()
	}
	if !ok {
		if waitFor != 0 {
			return nil, l.Errorf("waiting for the poll in progress: %w", ctx.Err())
		}
		return nil, l.wrap(ctx.Err())
	}
	defer func() { <-l.hostsTurn }()

	l.mu.Lock()
	last := l.last
	shared := waitFor != 0 && l.polls >= waitFor
	fresh := !last.at.IsZero() && l.cfg.Now().Sub(last.at) < l.cfg.MinInterval
	if (shared || fresh) && (last.err == nil || (fresh && l.cfg.KeepErrors)) {
		l.mu.Unlock()
		if last.err != nil {
			return nil, last.err
		}
		return slices.Clone(last.hosts), nil
	}
	l.inflight = true
	l.mu.Unlock()

	start := l.cfg.Now()
	hosts, err := l.d.ListHosts(ctx)
	if err != nil {
		err = l.wrap(withCtx(ctx, err))
		hosts = nil
	}
	l.mu.Lock()
	l.inflight = false
	l.polls++
	if err == nil || ctx.Err() == nil {
		l.last = answer{hosts: hosts, err: err, at: start}
	} else {
		l.last = answer{} // the caller gave up: nothing is kept
	}
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return slices.Clone(hosts), nil
}

// Forget makes the next Hosts call poll the cloud: the group is known to be changing.
func (l *Loop) Forget() {
	l.mu.Lock()
	l.last = answer{}
	l.mu.Unlock()
}

// Notices polls the driver's notices, one poll at a time, and returns each ID once per
// answer. Notices in an answer mean the group is changing: the next Hosts polls the cloud.
// A driver without notices has none.
func (l *Loop) Notices(ctx context.Context) ([]Notice, error) {
	nd, ok := l.d.(NoticeDriver)
	if !ok {
		return nil, nil
	}
	if !take(ctx, l.noticesTurn) {
		return nil, l.wrap(ctx.Err())
	}
	defer func() { <-l.noticesTurn }()
	ns, err := nd.ListNotices(ctx)
	if err != nil {
		return nil, l.wrap(withCtx(ctx, err))
	}
	out := make([]Notice, 0, len(ns))
	seen := make(map[string]bool, len(ns))
	for _, n := range ns {
		if n.ID != "" && seen[n.ID] {
			continue
		}
		seen[n.ID] = true
		out = append(out, n)
	}
	if len(out) > 0 {
		l.Forget()
	}
	return out, nil
}

// CompleteNotice answers n through the driver. Answering a notice again must be harmless:
// the driver says so of a notice its cloud no longer holds open (an AWS lifecycle action
// already completed), and the call is made each time, so that a failed answer can be retried.
// A driver whose notices need no answer completes them all at once.
func (l *Loop) CompleteNotice(ctx context.Context, n Notice) error {
	if err := ctx.Err(); err != nil {
		return l.wrap(err)
	}
	ad, ok := l.d.(AnswerDriver)
	if !ok {
		return nil
	}
	if err := ad.AnswerNotice(ctx, n); err != nil {
		return l.wrap(withCtx(ctx, err))
	}
	return nil
}

// Call makes one request to endpoint ep through its gate: it waits out ep's rest when that
// fits ctx (else it fails at once with a *throttle.Error, not calling), makes the request,
// and on failure asks the driver's Classify. A Rest verdict closes ep's gate; a Retry
// verdict makes the request again once the gate opens, Tries requests in all, while the
// wait fits ctx. Anything else is returned at once. ctx ending stops it, with ctx's error.
func (l *Loop) Call(ctx context.Context, ep string, op func(context.Context) error) error {
	return l.CallN(ctx, ep, l.cfg.Tries, op)
}

// CallN is Call with at most tries requests (1: a request that is never retried).
func (l *Loop) CallN(ctx context.Context, ep string, tries int, op func(context.Context) error) error {
	var last error // the previous try's failure
	for try := 1; ; try++ {
		if err := l.gates.Wait(ctx, ep); err != nil {
			if errors.Is(err, throttle.ErrThrottled) {
				err = l.throttled(ep, err)
			}
			if last != nil {
				return &RetryError{Endpoint: ep, Tries: try - 1, Err: last, Gate: err}
			}
			return err
		}
		err := op(ctx)
		if err == nil {
			l.gates.Succeeded(ep)
			return nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return withCtx(ctx, err)
		}
		v := l.d.Classify(err)
		if !v.Rest && !v.Retry {
			return err
		}
		wait := l.gates.Throttled(ep, v.After, err)
		l.log.Warn("the cloud turned a request away; the endpoint rests", "endpoint", ep, "try", try,
			"retry_after", v.After, "wait", wait, "error", err)
		if !v.Retry || try >= tries {
			if try > 1 {
				return l.throttled(ep, &RetryError{Endpoint: ep, Tries: try, Err: err, Wait: wait})
			}
			return l.throttled(ep, err)
		}
		last = err
	}
}

// throttled wraps the cloud's sentinel, if any, around err from endpoint ep.
func (l *Loop) throttled(ep string, err error) error {
	if l.cfg.Throttled == nil {
		return err
	}
	return fmt.Errorf("%s: %w: %w", ep, l.cfg.Throttled, err)
}

// Ready is nil when ep may be called now or its rest fits ctx; else a *throttle.Error. A
// poll that needs several endpoints checks them all before it calls any.
func (l *Loop) Ready(ctx context.Context, ep string) error { return l.gates.Ready(ctx, ep) }

// Open is nil when ep may be called now, else a *throttle.Error: for a poll that never waits.
func (l *Loop) Open(ep string) error { return l.gates.Open(ep) }

// Rest closes ep's gate after err, for a failure seen outside Call (an SDK that retried on
// its own); after is the server's Retry-After, negative when none. It returns the rest.
func (l *Loop) Rest(ep string, after time.Duration, err error) time.Duration {
	return l.gates.Throttled(ep, after, err)
}

// Until is when ep's gate opens; zero when open.
func (l *Loop) Until(ep string) time.Time { return l.gates.Until(ep) }

// RetryError is a request retried in vain: Tries requests were made, the last failed with
// Err, and either the endpoint now rests Wait, or Gate says why the next try was not made.
type RetryError struct {
	Endpoint string
	Tries    int
	Err      error
	Wait     time.Duration
	Gate     error // nil, or the *throttle.Error (or ctx error) that stopped the next try
}

func (e *RetryError) Error() string {
	if e.Gate != nil {
		return fmt.Sprintf("%s: %d tries, the last: %v; no further try: %v", e.Endpoint, e.Tries, e.Err, e.Gate)
	}
	return fmt.Sprintf("%s: %d tries, the last: %v (the endpoint now rests %v)", e.Endpoint, e.Tries, e.Err, e.Wait.Round(time.Millisecond))
}

// Unwrap is both the last failure and what stopped the retries.
func (e *RetryError) Unwrap() []error {
	if e.Gate != nil {
		return []error{e.Err, e.Gate}
	}
	return []error{e.Err}
}

var (
	_ Provider        = (*Loop)(nil)
	_ Noticer         = (*Loop)(nil)
	_ NoticeCompleter = (*Loop)(nil)
)

// Do makes one request of a call other than a poll (a capacity call) to endpoint ep, as Call
// does, and prefixes its error as a poll's: "name: where: …".
func (l *Loop) Do(ctx context.Context, ep string, op func(context.Context) error) error {
	if err := l.Call(ctx, ep, op); err != nil {
		return l.wrap(withCtx(ctx, err))
	}
	return nil
}
