// Package netguard keeps a listener of the driver's serving under a connection flood: the
// driver's port takes workers, agents and operators, and with --launcher ssh or agent it
// listens on every interface, where anyone can open connections to it.
//
// A connection is pending from its accept until its first request starts (http.Server's
// StateActive); an HTTP client sends one at once, a flood's idle connection never does.
// Pending connections are capped, in all and per source address; past a cap the oldest
// pending one (of that address, else of all) is closed, so a flood cannot hold the port
// and a real client's new connection, which turns active within moments, is not the one
// to go. Idle pending connections are also closed by http.Server's ReadHeaderTimeout, which
// the driver keeps short. Accept errors (EMFILE: out of file descriptors) are retried with a
// backoff up to a second and logged once per interval with their count, instead of on every
// retry.
package netguard

import (
	"container/list"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Defaults of Config.
const (
	DefaultMaxPending      = 1024
	DefaultMaxPendingPerIP = 128
	DefaultLogInterval     = 10 * time.Second
	maxBackoff             = time.Second
)

// Config sets the caps; zero fields take the defaults.
type Config struct {
	MaxPending      int           // pending connections in all
	MaxPendingPerIP int           // pending connections from one source address
	LogInterval     time.Duration // at most one accept-error line per interval
	Logger          *slog.Logger
}

// Listener is a net.Listener with the caps above. Set its ConnState as the http.Server's.
type Listener struct {
	net.Listener
	cfg Config

	mu      sync.Mutex
	pending *list.List                 // of *conn, oldest first
	byConn  map[net.Conn]*list.Element // pending connections
	perIP   map[string]int             // pending connections by source address
	evicted int                        // pending connections closed for the caps, since the last log line
	lastLog time.Time                  // the last accept-error or eviction log line
	errs    int                        // accept errors since the last log line
	now     func() time.Time           // for tests
	sleep   func(time.Duration) <-chan time.Time
}

type conn struct {
	net.Conn
	ip string
}

// New wraps ln.
func New(ln net.Listener, cfg Config) *Listener {
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.MaxPendingPerIP <= 0 {
		cfg.MaxPendingPerIP = DefaultMaxPendingPerIP
	}
	if cfg.LogInterval <= 0 {
		cfg.LogInterval = DefaultLogInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Listener{Listener: ln, cfg: cfg, pending: list.New(), byConn: map[net.Conn]*list.Element{}, perIP: map[string]int{},
		now: time.Now, sleep: time.After}
}

// Accept returns the next connection. Errors that retrying may cure (out of file
// descriptors, a connection reset before it was taken) are retried here with a backoff, so
// that http.Server never sees them; other errors (the listener closed) are returned.
func (l *Listener) Accept() (net.Conn, error) {
	backoff := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			l.admit(c)
			return c, nil
		}
		if !retryable(err) {
			return nil, err
		}
		l.mu.Lock()
		l.errs++
		l.maybeLog(err)
		l.mu.Unlock()
		<-l.sleep(backoff)
		backoff = min(2*backoff, maxBackoff)
	}
}

func retryable(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	// EMFILE, ENFILE, ECONNABORTED and the like: what http.Server itself retries.
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// maybeLog logs the accept errors and evictions counted since the last line, once per
// LogInterval. l.mu is held.
func (l *Listener) maybeLog(err error) {
	now := l.now()
	if !l.lastLog.IsZero() && now.Sub(l.lastLog) < l.cfg.LogInterval {
		return
	}
	args := []any{"accept_errors", l.errs, "closed_pending", l.evicted, "pending", l.pending.Len(), "interval", l.cfg.LogInterval}
	if err != nil {
		args = append(args, "last_error", err.Error())
	}
	l.cfg.Logger.Warn("connection flood? accept errors are retried and idle connections closed; the job goes on", args...)
	l.lastLog, l.errs, l.evicted = now, 0, 0
}

// admit records c as pending, closing the oldest pending connection past a cap.
func (l *Listener) admit(c net.Conn) {
	ip := "?"
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ip = a.IP.String()
	}
	var drop []net.Conn
	l.mu.Lock()
	l.byConn[c] = l.pending.PushBack(&conn{Conn: c, ip: ip})
	l.perIP[ip]++
	if l.perIP[ip] > l.cfg.MaxPendingPerIP {
		for e := l.pending.Front(); e != nil; e = e.Next() {
			if p := e.Value.(*conn); p.ip == ip {
				drop = append(drop, l.forget(p.Conn))
				break
			}
		}
	}
	for l.pending.Len() > l.cfg.MaxPending {
		drop = append(drop, l.forget(l.pending.Front().Value.(*conn).Conn))
	}
	l.evicted += len(drop)
	if len(drop) > 0 {
		l.maybeLog(nil)
	}
	l.mu.Unlock()
	for _, d := range drop {
		d.Close() // http.Server's read fails, and it forgets the connection
	}
}

// forget drops c from the pending set and returns it; l.mu is held.
func (l *Listener) forget(c net.Conn) net.Conn {
	e, ok := l.byConn[c]
	if !ok {
		return c
	}
	p := e.Value.(*conn)
	l.pending.Remove(e)
	delete(l.byConn, c)
	if l.perIP[p.ip]--; l.perIP[p.ip] <= 0 {
		delete(l.perIP, p.ip)
	}
	return c
}

// ConnState is for http.Server.ConnState: a connection whose first request starts is no
// longer pending; a closed one is forgotten.
func (l *Listener) ConnState(c net.Conn, st http.ConnState) {
	switch st {
	case http.StateActive, http.StateClosed, http.StateHijacked:
		l.mu.Lock()
		l.forget(c)
		l.mu.Unlock()
	}
}

// Pending is how many connections have not started a request.
func (l *Listener) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending.Len()
}
