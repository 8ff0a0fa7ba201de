package peerstate_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/worker/peerstate"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func blob(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// event is one reply a holder gave, as its Observe hook saw it.
type event struct {
	at time.Time
	peerstate.Reply
}

// holder is a Server on 127.0.0.1 with its replies recorded.
type holder struct {
	srv     *peerstate.Server
	mu      sync.Mutex
	log     []event
	exclude map[string]bool // remote addresses of the occupying joiner: not recorded
	hook    func(log []event)
}

func newHolder(t *testing.T, cfg peerstate.ServerConfig) *holder {
	t.Helper()
	h := &holder{}
	cfg.Secret = orDefault(cfg.Secret, secret)
	cfg.Observe = func(r peerstate.Reply) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.exclude[r.Remote] {
			return
		}
		h.log = append(h.log, event{time.Now(), r})
		if h.hook != nil {
			h.hook(h.log)
		}
	}
	srv, err := peerstate.Listen(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	h.srv = srv
	return h
}

func orDefault(a, b []byte) []byte {
	if a != nil {
		return a
	}
	return b
}

func (h *holder) events() []event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.log)
}

func (h *holder) forget() {
	h.mu.Lock()
	h.log = nil
	h.mu.Unlock()
}

func (h *holder) addr() peerstate.Holder { return peerstate.Holder{Addr: h.srv.Addr(), Host: "remote"} }

// gate is state read through io.ReaderAt that, once armed, blocks reads (those blockAt
// selects) until released, or fails them once killed: a holder stuck mid-transfer.
type gate struct {
	data    []byte
	blockAt func(off int64) bool
	mu      sync.Mutex
	armed   bool
	blocked chan struct{} // a read blocked
	release chan struct{}
	kill    chan struct{}
	relOnce sync.Once
}

func newGate(t *testing.T, data []byte, blockAt func(int64) bool) *gate {
	g := &gate{data: data, blockAt: blockAt, blocked: make(chan struct{}, 64), release: make(chan struct{}), kill: make(chan struct{})}
	t.Cleanup(g.open) // before the servers' Close (cleanups run last first)
	return g
}

func (g *gate) arm()  { g.mu.Lock(); g.armed = true; g.mu.Unlock() }
func (g *gate) open() { g.relOnce.Do(func() { close(g.release) }) }

func (g *gate) ReadAt(p []byte, off int64) (int, error) {
	g.mu.Lock()
	block := g.armed && (g.blockAt == nil || g.blockAt(off))
	g.mu.Unlock()
	if block {
		g.blocked <- struct{}{}
		select {
		case <-g.release:
		case <-g.kill:
			return 0, errors.New("holder killed")
		}
	}
	return copy(p, g.data[off:]), nil
}

// gatedHolder publishes data through a gate and has served one fetch already, so that its
// manifest is computed; then the gate is armed.
func gatedHolder(t *testing.T, cfg peerstate.ServerConfig, version uint64, data []byte, blockAt func(int64) bool) (*holder, *gate) {
	t.Helper()
	h := newHolder(t, cfg)
	g := newGate(t, data, blockAt)
	if err := h.srv.PublishFrom(version, g, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	got, _, err := newFetcher(t, peerstate.FetcherConfig{}).Fetch(ctxFor(t, 10*time.Second), version, []peerstate.Holder{h.addr()})
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("warm-up fetch: %v", err)
	}
	g.arm()
	h.forget()
	return h, g
}

// occupy starts another joiner whose one transfer from h blocks in g, so h is at its
// MaxTransfers of 1; it returns when the transfer is stuck, and waits for the joiner at the
// end of the test.
func occupy(t *testing.T, h *holder, g *gate, version uint64) {
	t.Helper()
	f := newFetcher(t, peerstate.FetcherConfig{Parallel: 1, PerHolder: 1})
	done := make(chan error, 1)
	// Not t.Context: that ends before the cleanup below lets the transfer finish.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	go func() {
		_, _, err := f.Fetch(ctx, version, []peerstate.Holder{h.addr()})
		done <- err
	}()
	t.Cleanup(func() {
		g.open()
		if err := <-done; err != nil {
			t.Errorf("the occupying joiner: %v", err)
		}
		cancel()
	})
	select {
	case <-g.blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the occupying joiner never started its transfer")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.exclude == nil {
		h.exclude = map[string]bool{}
	}
	for _, e := range h.log { // its one connection
		h.exclude[e.Remote] = true
	}
	h.log = nil
}

func newFetcher(t *testing.T, cfg peerstate.FetcherConfig) *peerstate.Fetcher {
	t.Helper()
	cfg.Secret = orDefault(cfg.Secret, secret)
	f, err := peerstate.NewFetcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// directory is the driver's answer, played by the test; it records when it was asked.
type directory struct {
	mu      sync.Mutex
	holders []peerstate.Holder
	asked   []time.Time
	onAsk   func()
}

func (d *directory) Holders(_ context.Context, _ uint64) ([]peerstate.Holder, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked = append(d.asked, time.Now())
	if d.onAsk != nil {
		d.onAsk()
	}
	return slices.Clone(d.holders), nil
}

func (d *directory) times() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.asked)
}

func TestFetchFromSeveralHoldersInParallel(t *testing.T) {
	data := blob(3<<20+12345, 1)
	var hs []peerstate.Holder
	var first *holder
	for range 3 {
		h := newHolder(t, peerstate.ServerConfig{ChunkSize: 256 << 10})
		h.srv.Publish(7, data)
		hs = append(hs, h.addr())
		if first == nil {
			first = h
		}
	}
	if err := first.srv.Prepare(); err != nil { // computed ahead on one holder, on request on the others
		t.Fatal(err)
	}
	got, st, err := newFetcher(t, peerstate.FetcherConfig{Parallel: 6}).Fetch(ctxFor(t, 10*time.Second), 7, hs)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("fetched state differs from the published one")
	}
	if st.Chunks != 13 || len(st.FromHolder) < 2 {
		t.Fatalf("stats %+v: want 13 chunks from at least 2 holders", st)
	}
	// Empty state is a valid state.
	h := newHolder(t, peerstate.ServerConfig{})
	h.srv.Publish(1, nil)
	if got, _, err := newFetcher(t, peerstate.FetcherConfig{}).Fetch(ctxFor(t, 5*time.Second), 1, []peerstate.Holder{h.addr()}); err != nil || len(got) != 0 {
		t.Fatalf("empty state: %d bytes, %v", len(got), err)
	}
}

func TestSameHostHoldersFirst(t *testing.T) {
	data := blob(1<<20, 2)
	var hs []peerstate.Holder
	for _, host := range []string{"far", "near", "far2"} {
		h := newHolder(t, peerstate.ServerConfig{ChunkSize: 64 << 10})
		h.srv.Publish(3, data)
		hs = append(hs, peerstate.Holder{Addr: h.srv.Addr(), Host: host})
	}
	got, st, err := newFetcher(t, peerstate.FetcherConfig{Host: "near", Parallel: 1}).Fetch(ctxFor(t, 10*time.Second), 3, hs)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetch: %v", err)
	}
	if st.FromHolder[hs[1].Addr] != st.Chunks {
		t.Fatalf("chunks per holder %v: want all %d from the holder on this host", st.FromHolder, st.Chunks)
	}
}

// The only holder is busy: the fetcher asks the directory, waits 150 ms between tries, never
// hammers it, and gets the state once the holder frees up.
func TestOnlyHolderBusy(t *testing.T) {
	data := blob(2<<20, 3)
	h, g := gatedHolder(t, peerstate.ServerConfig{MaxTransfers: 1, ChunkSize: 512 << 10}, 4, data, nil)
	occupy(t, h, g, 4)
	dir := &directory{holders: []peerstate.Holder{h.addr()}}
	// The holder frees up once it has turned this joiner away three times.
	h.mu.Lock()
	h.hook = func(log []event) {
		busy := 0
		for _, e := range log {
			if e.Status == peerstate.StatusBusy {
				busy++
			}
		}
		if busy >= 3 {
			g.open()
		}
	}
	h.mu.Unlock()
	f := newFetcher(t, peerstate.FetcherConfig{Directory: dir})
	start := time.Now()
	got, st, err := f.Fetch(ctxFor(t, 10*time.Second), 4, []peerstate.Holder{h.addr()})
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetch: %v", err)
	}
	if st.Busy < 3 || st.Waits < 1 || st.DirectoryQueries < 1 {
		t.Fatalf("stats %+v: want at least 3 busy answers, a wait and a directory query", st)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("done in %v: a busy holder must be left alone for 150ms", d)
	}
	checkNotHammered(t, h.events(), 2)
}

// checkNotHammered: in any 150 ms, a holder answers BUSY to a fetcher at most perHolder
// times (the requests already on their way when the first BUSY came back).
func checkNotHammered(t *testing.T, evs []event, perHolder int) {
	t.Helper()
	var busy []time.Time
	for _, e := range evs {
		if e.Kind == peerstate.KindChunk && e.Status == peerstate.StatusBusy {
			busy = append(busy, e.at)
		}
	}
	for i := 0; i+perHolder < len(busy); i++ {
		if gap := busy[i+perHolder].Sub(busy[i]); gap < 150*time.Millisecond {
			t.Fatalf("busy answers %d and %d only %v apart: the holder was hammered (times %v)", i, i+perHolder, gap, busy)
		}
	}
}

// All holders busy: the fetcher tries each once, asks the directory (which names no one
// new), waits 150 ms, then gets the state from the freed holders.
func TestAllHoldersBusyThenFreed(t *testing.T) {
	data := blob(2<<20, 4)
	cfg := peerstate.ServerConfig{MaxTransfers: 1, ChunkSize: 512 << 10}
	h1, g1 := gatedHolder(t, cfg, 9, data, nil)
	h2, g2 := gatedHolder(t, cfg, 9, data, nil)
	occupy(t, h1, g1, 9)
	occupy(t, h2, g2, 9)
	dir := &directory{holders: []peerstate.Holder{h1.addr(), h2.addr()}}
	// Each holder must have been tried (and answered BUSY) before the directory is asked. A
	// holder logs its answer just after sending it, so the fetcher may ask a moment before
	// the log has it: wait for it here, where the fetcher is blocked in its question and can
	// try no holder meanwhile.
	triedFirst := map[*holder]bool{}
	before := map[*holder]int{} // events logged by the time the directory answered
	dir.onAsk = func() {
		deadline := time.Now().Add(2 * time.Second)
		for _, h := range []*holder{h1, h2} {
			for !triedFirst[h] && time.Now().Before(deadline) {
				for _, e := range h.events() {
					triedFirst[h] = triedFirst[h] || e.Kind == peerstate.KindChunk && e.Status == peerstate.StatusBusy
				}
				if !triedFirst[h] {
					time.Sleep(time.Millisecond)
				}
			}
		}
		before[h1], before[h2] = len(h1.events()), len(h2.events())
		g1.open() // the holders free up as the driver answers
		g2.open()
	}
	f := newFetcher(t, peerstate.FetcherConfig{Directory: dir, PerHolder: 1})
	got, st, err := f.Fetch(ctxFor(t, 10*time.Second), 9, []peerstate.Holder{h1.addr(), h2.addr()})
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetch: %v", err)
	}
	asked := dir.times()
	if len(asked) != 1 || st.DirectoryQueries != 1 || st.Waits < 1 {
		t.Fatalf("directory asked %d times, stats %+v: want once, then a wait", len(asked), st)
	}
	var firstBusy time.Time
	for _, h := range []*holder{h1, h2} {
		evs := h.events()
		var busy []event
		for _, e := range evs {
			if e.Kind == peerstate.KindChunk && e.Status == peerstate.StatusBusy {
				busy = append(busy, e)
			}
		}
		if len(busy) == 0 || !triedFirst[h] {
			t.Fatalf("holder %s: busy answers %v; each holder must be tried before the directory is asked at %v", h.srv.Addr(), busy, asked[0])
		}
		if firstBusy.IsZero() || busy[0].at.Before(firstBusy) {
			firstBusy = busy[0].at
		}
	}
	// After the directory, no request for 150 ms after the first busy answer.
	for _, h := range []*holder{h1, h2} {
		for _, e := range h.events()[before[h]:] {
			if e.Kind == peerstate.KindChunk && e.at.Sub(firstBusy) < 150*time.Millisecond {
				t.Fatalf("holder %s got a request %v after the first busy answer: want a 150ms wait", h.srv.Addr(), e.at.Sub(firstBusy))
			}
		}
	}
}

// When every known holder is busy and the directory names a free one, the fetcher uses it at
// once, without waiting.
func TestDirectoryNamesAnotherHolder(t *testing.T) {
	data := blob(1<<20, 5)
	h1, g1 := gatedHolder(t, peerstate.ServerConfig{MaxTransfers: 1, ChunkSize: 256 << 10}, 2, data, nil)
	occupy(t, h1, g1, 2)
	h2 := newHolder(t, peerstate.ServerConfig{ChunkSize: 256 << 10})
	h2.srv.Publish(2, data)
	dir := &directory{holders: []peerstate.Holder{h1.addr(), h2.addr()}}
	got, st, err := newFetcher(t, peerstate.FetcherConfig{Directory: dir}).Fetch(ctxFor(t, 10*time.Second), 2, []peerstate.Holder{h1.addr()})
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetch: %v", err)
	}
	if st.DirectoryQueries != 1 || st.Waits != 0 || st.FromHolder[h2.srv.Addr()] != st.Chunks {
		t.Fatalf("stats %+v: want one directory query, no wait, every chunk from the holder it named", st)
	}
}

// A holder dies mid-transfer (part of a chunk sent, then its connections and listener
// close): its chunks come from the other holder.
func TestHolderDiesMidTransfer(t *testing.T) {
	data := blob(8<<20, 6)
	chunk := 2 << 20
	// Block on the second piece of a chunk: the first megabyte of it is already sent.
	h1, g1 := gatedHolder(t, peerstate.ServerConfig{ChunkSize: chunk}, 5, data, func(off int64) bool { return off%int64(chunk) != 0 })
	h2 := newHolder(t, peerstate.ServerConfig{ChunkSize: chunk})
	h2.srv.Publish(5, data)
	f := newFetcher(t, peerstate.FetcherConfig{Parallel: 4, PerHolder: 2})
	type res struct {
		b   []byte
		st  peerstate.FetchStats
		err error
	}
	done := make(chan res, 1)
	go func() {
		b, st, err := f.Fetch(ctxFor(t, 10*time.Second), 5, []peerstate.Holder{h1.addr(), h2.addr()})
		done <- res{b, st, err}
	}()
	select {
	case <-g1.blocked:
	case r := <-done:
		t.Fatalf("fetch ended (%v) without using holder 1", r.err)
	}
	close(g1.kill) // the holder dies: its reads fail and it closes everything
	h1.srv.Close()
	r := <-done
	if r.err != nil || !bytes.Equal(r.b, data) {
		t.Fatalf("fetch: %v", r.err)
	}
	if r.st.Failed < 1 || r.st.FromHolder[h2.srv.Addr()] < 1 {
		t.Fatalf("stats %+v: want holder 1 dropped and its chunks from holder 2", r.st)
	}
}

// corrupter is a TCP proxy in front of a holder that flips one byte of what the holder sends
// at offset `at` of every connection: corruption in transit.
func corrupter(t *testing.T, target string, at int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Go(func() { io.Copy(out, in); out.Close() })
			wg.Go(func() {
				defer in.Close()
				buf := make([]byte, 64<<10)
				seen := 0
				for {
					n, err := out.Read(buf)
					if seen <= at && at < seen+n {
						buf[at-seen] ^= 0x5a
					}
					seen += n
					if n > 0 {
						if _, werr := in.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

func TestCorruptChunkIsDetectedAndRefetched(t *testing.T) {
	data := blob(4<<20, 7)
	cfg := peerstate.ServerConfig{ChunkSize: 1 << 20}
	h1 := newHolder(t, cfg)
	h1.srv.Publish(8, data)
	h2 := newHolder(t, cfg)
	h2.srv.Publish(8, data)
	bad := peerstate.Holder{Addr: corrupter(t, h1.srv.Addr(), 300_000), Host: "remote"}
	got, st, err := newFetcher(t, peerstate.FetcherConfig{}).Fetch(ctxFor(t, 10*time.Second), 8, []peerstate.Holder{bad, h2.addr()})
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetch: %v", err)
	}
	if st.Corrupt < 1 {
		t.Fatalf("stats %+v: the corrupt chunk went unnoticed", st)
	}
	// With only the corrupting path, the fetch fails and says why.
	_, _, err = newFetcher(t, peerstate.FetcherConfig{}).Fetch(ctxFor(t, 10*time.Second), 8, []peerstate.Holder{bad})
	if !errors.Is(err, peerstate.ErrNoHolder) || !strings.Contains(err.Error(), "verification") {
		t.Fatalf("fetch through the corrupter only: %v, want ErrNoHolder naming the failed verification", err)
	}
}

func TestStrangerIsDenied(t *testing.T) {
	h := newHolder(t, peerstate.ServerConfig{})
	h.srv.Publish(1, blob(1000, 8))
	_, _, err := newFetcher(t, peerstate.FetcherConfig{Secret: []byte("not the job secret")}).Fetch(ctxFor(t, 5*time.Second), 1, []peerstate.Holder{h.addr()})
	if !errors.Is(err, peerstate.ErrNoHolder) || !strings.Contains(err.Error(), "denied") {
		t.Fatalf("fetch with a wrong secret: %v, want ErrNoHolder, denied", err)
	}
	if s := h.srv.Stats(); s.Denied != 1 || s.BytesSent != 0 || s.Requests != 0 {
		t.Fatalf("server stats %+v: want one denied request and nothing sent", s)
	}
}

func TestWrongVersionAndNoHolders(t *testing.T) {
	h := newHolder(t, peerstate.ServerConfig{})
	h.srv.Publish(5, blob(1000, 9))
	_, _, err := newFetcher(t, peerstate.FetcherConfig{}).Fetch(ctxFor(t, 5*time.Second), 6, []peerstate.Holder{h.addr()})
	if !errors.Is(err, peerstate.ErrNoHolder) || !strings.Contains(err.Error(), "holds version 5") {
		t.Fatalf("fetch of a version nobody holds: %v", err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	dir := &directory{}
	_, st, err := newFetcher(t, peerstate.FetcherConfig{Directory: dir}).Fetch(ctxFor(t, 5*time.Second), 6, []peerstate.Holder{{Addr: dead}})
	if !errors.Is(err, peerstate.ErrNoHolder) || st.DirectoryQueries != 1 {
		t.Fatalf("fetch from a dead holder: %v (stats %+v), want ErrNoHolder after one directory query", err, st)
	}
}

// A holder that stays busy cannot make a fetch hang: the context bounds it.
func TestFetchBoundedByContext(t *testing.T) {
	data := blob(1<<20, 10)
	h, g := gatedHolder(t, peerstate.ServerConfig{MaxTransfers: 1, ChunkSize: 256 << 10}, 1, data, nil)
	occupy(t, h, g, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 400*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, st, err := newFetcher(t, peerstate.FetcherConfig{}).Fetch(ctx, 1, []peerstate.Holder{h.addr()})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("fetch from a holder busy for good: %v, want the context's deadline", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("fetch took %v past a 400ms deadline", d)
	}
	if st.Busy > 2*(3+1) {
		t.Fatalf("%d busy answers in 400ms: the holder was hammered", st.Busy)
	}
	checkNotHammered(t, h.events(), 2)
}

func TestConfigValidation(t *testing.T) {
	if _, err := peerstate.Listen(peerstate.ServerConfig{}, "127.0.0.1:0"); err == nil || !strings.Contains(err.Error(), "secret") {
		t.Fatalf("server without a secret: %v", err)
	}
	if _, err := peerstate.Listen(peerstate.ServerConfig{Secret: secret, ChunkSize: 10}, "127.0.0.1:0"); err == nil || !strings.Contains(err.Error(), "ChunkSize") {
		t.Fatalf("tiny chunks: %v", err)
	}
	if _, err := peerstate.NewFetcher(peerstate.FetcherConfig{}); err == nil || !strings.Contains(err.Error(), "secret") {
		t.Fatalf("fetcher without a secret: %v", err)
	}
}

// After Unpublish a holder serves nothing, and a later Publish serves again.
func TestUnpublish(t *testing.T) {
	h := newHolder(t, peerstate.ServerConfig{})
	data := blob(1000, 11)
	h.srv.Publish(5, data)
	h.srv.Unpublish()
	_, _, err := newFetcher(t, peerstate.FetcherConfig{}).Fetch(ctxFor(t, 5*time.Second), 5, []peerstate.Holder{h.addr()})
	if !errors.Is(err, peerstate.ErrNoHolder) || !strings.Contains(err.Error(), "holds version 0") {
		t.Fatalf("fetch from a holder that unpublished: %v, want ErrNoHolder, holds version 0", err)
	}
	h.srv.Publish(6, data)
	if got, _, err := newFetcher(t, peerstate.FetcherConfig{}).Fetch(ctxFor(t, 5*time.Second), 6, []peerstate.Holder{h.addr()}); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetch after a new Publish: %v", err)
	}
}
