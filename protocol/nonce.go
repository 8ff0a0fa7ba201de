package protocol

import (
	"sync"
	"time"
)

// nonceCache remembers the nonces of authenticated requests for at least span, so that a
// captured request cannot be replayed while its timestamp is still inside the window. It is
// two maps rotated every span: memory is bounded by the request rate times 2·span, and no
// goroutine is needed to expire entries.
type nonceCache struct {
	span time.Duration

	mu      sync.Mutex
	cur     map[[nonceBytes]byte]struct{}
	prev    map[[nonceBytes]byte]struct{}
	rotated time.Time
}

func newNonceCache(span time.Duration, now time.Time) *nonceCache {
	return &nonceCache{
		span:    span,
		cur:     map[[nonceBytes]byte]struct{}{},
		prev:    map[[nonceBytes]byte]struct{}{},
		rotated: now,
	}
}

// add records n and reports whether it was new. Checking and recording happen under one lock,
// so two copies of a request racing each other cannot both pass.
func (c *nonceCache) add(n [nonceBytes]byte, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if age := now.Sub(c.rotated); age >= c.span {
		// Fresh maps rather than clear(), so that memory taken by a burst is given back.
		c.prev, c.cur = c.cur, map[[nonceBytes]byte]struct{}{}
		if age >= 2*c.span {
			c.prev = map[[nonceBytes]byte]struct{}{} // every entry is older than span
		}
		c.rotated = now
	}
	if _, ok := c.cur[n]; ok {
		return false
	}
	if _, ok := c.prev[n]; ok {
		return false
	}
	c.cur[n] = struct{}{}
	return true
}
