package allreduce

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// These tests put a hand-driven fake peer on the other end of a real loopback socket, to send
// what no correct rank would.

const fakeGen = 7

func logTo(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tLog struct{ t testing.TB }

func (w tLog) Write(p []byte) (int, error) { w.t.Log(strings.TrimSpace(string(p))); return len(p), nil }

// helloBytes is the hello that rank `rank` of cfg's world sends, with its MAC when cfg has a
// secret.
func helloBytes(cfg Config, rank int) []byte {
	cfg.Rank = rank
	c := &Comm{cfg: cfg}
	var b [headerLen]byte
	h := c.helloHeader(rank)
	h.put(b[:])
	out := b[:]
	if len(cfg.Secret) > 0 {
		out = append(out, c.mac(b[:])...)
	}
	return out
}

// fakePair builds a world of two: rank 0 is a real Comm, rank 1 is the returned connection,
// built is what New returned in the goroutine newAsync starts.
type built struct {
	c   *Comm
	err error
}

// newAsync runs New in a goroutine, for a test that plays the other rank meanwhile.
func newAsync(ctx context.Context, cfg Config) <-chan built {
	res := make(chan built, 1)
	go func() {
		c, err := New(ctx, cfg)
		res <- built{c, err}
	}()
	return res
}

// which has completed the real hello.
func fakePair(t *testing.T, tweak func(*Config)) (*Comm, *net.TCPConn) {
	t.Helper()
	store := NewMemStore()
	cfg := Config{Rank: 0, Size: 2, Generation: fakeGen, Store: store, Timeout: 10 * time.Second, Logger: logTo(t)}
	if tweak != nil {
		tweak(&cfg)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res := newAsync(ctx, cfg)
	// Rank 0 reads every rank's record to group the ranks by host; the fake has no host.
	store.Set(ctx, addrKey(fakeGen, 1), []byte("127.0.0.1:1"))
	rec, err := store.Get(ctx, addrKey(fakeGen, 0))
	if err != nil {
		t.Fatal(err)
	}
	addr, err := parseRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", addr.Addr)
	if err != nil {
		t.Fatal(err)
	}
	conn := nc.(*net.TCPConn)
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(helloBytes(cfg.withDefaults(), 1)); err != nil {
		t.Fatal(err)
	}
	var b [headerLen]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		t.Fatalf("read rank 0's hello: %v", err)
	}
	if h, err := parseHeader(b[:]); err != nil || h.kind != kindHello || h.unit != 0 || h.gen != fakeGen {
		t.Fatalf("rank 0 answered the hello with %+v, %v", h, err)
	}
	// Rank 0, the lower, offers shared memory (or nothing); the fake declines: its frames
	// go over this connection.
	h, offer := readFrame(t, conn)
	if h.kind != kindShm || h.unit != 0 || h.gen != fakeGen {
		t.Fatalf("rank 0 sent %+v after the hello, want a transport offer", h)
	}
	if len(offer) > 0 {
		if _, err := conn.Write(frameBytes(header{kind: kindShm, gen: fakeGen, unit: 1, length: 1}, []byte{0})); err != nil {
			t.Fatal(err)
		}
	}
	conn.SetDeadline(time.Time{})
	r := <-res
	if r.err != nil {
		t.Fatalf("New: %v", r.err)
	}
	if s := r.c.Stats(); s.SharedMemory != 0 {
		t.Fatalf("rank 0 uses shared memory with a peer that declined it: %+v", s)
	}
	t.Cleanup(func() { r.c.Close() })
	return r.c, conn
}

// readFrame reads one frame from the real rank.
func readFrame(t *testing.T, conn net.Conn) (header, []byte) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [headerLen]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		t.Fatalf("read a frame from rank 0: %v", err)
	}
	h, err := parseHeader(b[:])
	if err != nil {
		t.Fatalf("rank 0 sent a bad header: %v", err)
	}
	p := make([]byte, h.length)
	if _, err := io.ReadFull(conn, p); err != nil {
		t.Fatalf("read a payload from rank 0: %v", err)
	}
	return h, p
}

func frameBytes(h header, payload []byte) []byte {
	b := make([]byte, headerLen, headerLen+len(payload))
	h.put(b)
	return append(b, payload...)
}

// fakePaths: with two ranks, doubling's only exchange is unit 1, the ring's first frame is
// unit 0; both expect back exactly the header they sent, as a correct rank 1 would send it.
var fakePaths = []struct {
	name   string
	tweak  func(*Config)
	frames int // frames each side sends in a 4-element Allreduce
}{
	{"doubling", nil, 1},
	{"ring", func(c *Config) { c.SmallBytes = 1 }, 2},
}

// TestFakePeerControl: a fake that answers every frame correctly (with zeros) completes the
// collective, so the garbage cases below fail for their garbage and nothing else.
func TestFakePeerControl(t *testing.T) {
	for _, path := range fakePaths {
		t.Run(path.name, func(t *testing.T) {
			c, conn := fakePair(t, path.tweak)
			data := []float32{1, 2, 3, 4}
			errc := make(chan error, 1)
			go func() { errc <- c.Allreduce(t.Context(), data, Sum) }()
			for range path.frames {
				h, p := readFrame(t, conn)
				if _, err := conn.Write(frameBytes(h, make([]byte, len(p)))); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-errc; err != nil {
				t.Fatalf("Allreduce against a correct fake: %v", err)
			}
			want := []float32{1, 2, 3, 4} // plus zeros
			if path.name == "ring" {
				want = []float32{0, 0, 3, 4} // segment 0 is the fake's, all zeros
			}
			if !bytes.Equal(binaryOf(data), binaryOf(want)) {
				t.Fatalf("result %v, want %v", data, want)
			}
		})
	}
}

func binaryOf(s []float32) []byte {
	b, _ := binary.Append(nil, binary.LittleEndian, s)
	return b
}

func TestGarbageFromPeer(t *testing.T) {
	with := func(f func(*header)) func(header, []byte) []byte {
		return func(h header, p []byte) []byte { f(&h); return frameBytes(h, p) }
	}
	raw := func(f func([]byte)) func(header, []byte) []byte {
		return func(h header, p []byte) []byte { b := frameBytes(h, p); f(b); return b }
	}
	cases := []struct {
		name  string
		send  func(h header, payload []byte) []byte // what the fake sends back
		close bool                                  // then half-close
		want  error
		msg   string
	}{
		{"random bytes", func(header, []byte) []byte {
			b := make([]byte, 4096)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			b[0] = 'X' // never the magic
			return b
		}, false, ErrProtocol, "bad magic"},
		{"wrong magic", raw(func(b []byte) { b[3] ^= 0x20 }), false, ErrProtocol, "bad magic"},
		{"unknown kind", raw(func(b []byte) { b[4] = 9 }), false, ErrProtocol, "unknown frame kind 9"},
		{"hello mid-collective", with(func(h *header) { h.kind = kindHello }), false, ErrProtocol, "frame kind 1 in the middle"},
		{"flags", raw(func(b []byte) { b[7] = 0x80 }), false, ErrProtocol, "unknown flags 0x80"},
		{"wrong generation", with(func(h *header) { h.gen = fakeGen - 1 }), false, ErrProtocol, "generation 6, expected 7"},
		{"wrong seq", with(func(h *header) { h.seq++ }), false, ErrProtocol, "collective #2, expected #1"},
		{"wrong op", with(func(h *header) { h.op = opAllreduce | uint8(Max) }), false, ErrProtocol, "Allreduce(max) on float32, expected Allreduce(sum)"},
		{"wrong dtype", with(func(h *header) { h.dtype = uint8(dtInt64) }), false, ErrProtocol, "on int64, expected Allreduce(sum) on float32"},
		{"wrong total", with(func(h *header) { h.total = 1 << 40 }), false, ErrProtocol, "of 1099511627776 bytes, this rank has 16"},
		{"wrong unit", with(func(h *header) { h.unit += 5 }), false, ErrProtocol, "expected unit"},
		{"length 0xFFFFFFFF", with(func(h *header) { h.length = 0xFFFFFFFF }), false, ErrProtocol, "of 4294967295 bytes"},
		{"abort too long", func(h header, _ []byte) []byte {
			return frameBytes(header{kind: kindAbort, gen: fakeGen, unit: 1, length: maxAbortLen + 1}, make([]byte, maxAbortLen+1))
		}, false, ErrProtocol, "abort frame of 1025 bytes"},
		{"abort 0xFFFFFFFF", func(h header, _ []byte) []byte {
			return frameBytes(header{kind: kindAbort, gen: fakeGen, unit: 1, length: 0xFFFFFFFF}, nil)
		}, false, ErrProtocol, "abort frame of 4294967295 bytes"},
		{"truncated header", func(h header, p []byte) []byte { return frameBytes(h, p)[:20] }, true, ErrPeerLost, "connection closed"},
		{"truncated payload", func(h header, p []byte) []byte { return frameBytes(h, p)[:headerLen+len(p)/2] }, true, ErrPeerLost, "connection closed"},
		{"a real abort", func(h header, _ []byte) []byte {
			why := "rank 1 gave up"
			return frameBytes(header{kind: kindAbort, gen: fakeGen, unit: 1, length: uint32(len(why))}, []byte(why))
		}, false, ErrPeerLost, "rank 1 gave up"},
	}
	for _, path := range fakePaths {
		for _, tc := range cases {
			t.Run(path.name+"/"+tc.name, func(t *testing.T) {
				c, conn := fakePair(t, path.tweak)
				errc := make(chan error, 1)
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				go func() { errc <- c.Allreduce(t.Context(), []float32{1, 2, 3, 4}, Sum) }()
				h, p := readFrame(t, conn)
				start := time.Now()
				if _, err := conn.Write(tc.send(h, p)); err != nil {
					t.Fatal(err)
				}
				if tc.close {
					conn.CloseWrite()
				}
				// The rank tells its neighbours whom to blame before it closes; read that
				// until its end of the connection closes.
				conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				rest, rerr := io.ReadAll(conn)
				conn.Close()
				var err error
				select {
				case err = <-errc:
				case <-time.After(10 * time.Second):
					t.Fatal("the collective did not return")
				}
				elapsed := time.Since(start)
				runtime.ReadMemStats(&after)
				t.Logf("after %v: %v", elapsed.Round(time.Millisecond), err)
				switch {
				case !errors.Is(err, tc.want):
					t.Fatalf("error %v does not wrap %v", err, tc.want)
				case !strings.Contains(err.Error(), tc.msg):
					t.Fatalf("error %q does not say %q", err, tc.msg)
				case elapsed > 2*time.Second:
					t.Fatalf("took %v (timeout %v)", elapsed, c.cfg.Timeout)
				}
				var pe *PeerError
				if errors.As(err, &pe) && pe.Rank != 1 {
					t.Fatalf("error blames rank %d, want 1", pe.Rank)
				}
				if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
					t.Fatalf("allocated %d bytes while failing", d)
				}
				if rerr != nil {
					t.Fatalf("reading what rank 0 sent after the garbage: %v", rerr)
				}
				if len(rest) < headerLen {
					t.Fatalf("rank 0 closed without an abort frame (sent %d bytes)", len(rest))
				}
				ah, err := parseHeader(rest[:headerLen])
				if err != nil || ah.kind != kindAbort || ah.unit != 1 || int(ah.length) != len(rest)-headerLen {
					t.Fatalf("rank 0's last frame %+v (%v), want an abort blaming rank 1 (%d bytes follow)", ah, err, len(rest)-headerLen)
				}
				t.Logf("abort sent to the fake: %s", rest[headerLen:])
				// Later operations report the failure instead of touching the socket.
				if err := c.Barrier(t.Context()); !errors.Is(err, tc.want) {
					t.Fatalf("Barrier after the failure: %v", err)
				}
			})
		}
	}
}

// TestStrangerDuringNew: connections that are not ranks of this world, arriving while the
// world builds, are refused with a reason, and the world still builds.
func TestStrangerDuringNew(t *testing.T) {
	const n = 3
	store := NewMemStore()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cfgFor := func(r int) Config {
		return Config{Rank: r, Size: n, Generation: fakeGen, Store: store, Timeout: 10 * time.Second, Logger: logTo(t)}
	}
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := func(r int) {
		wg.Go(func() { comms[r], errs[r] = New(ctx, cfgFor(r)) })
	}
	t.Cleanup(func() {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
	})
	start(0)
	start(1) // rank 2 waits, so rank 0 is still accepting
	rec, err := store.Get(ctx, addrKey(fakeGen, 0))
	if err != nil {
		t.Fatal(err)
	}
	addr, err := parseRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() net.Conn {
		conn, err := net.Dial("tcp", addr.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		return conn
	}
	hello := func(mod func(*header)) []byte {
		b := helloBytes(cfgFor(2).withDefaults(), 2)
		h, _ := parseHeader(b)
		mod(&h)
		h.put(b)
		return b
	}
	refused := []struct {
		name string
		send []byte
		want string
	}{
		{"garbage", bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 3), "bad magic"},
		{"other generation", hello(func(h *header) { h.gen = fakeGen + 1 }), "hello from generation 8"},
		{"other world size", hello(func(h *header) { h.total = 4 }), "world size 4"},
		{"rank that does not dial", hello(func(h *header) { h.unit = 9 }), "rank 9, which does not dial"},
		{"data frame", frameBytes(header{kind: kindData, gen: fakeGen, length: 0}, nil), "got frame kind 2"},
	}
	for _, s := range refused {
		conn := dial()
		if _, err := conn.Write(s.send); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		// The rank closes with the stranger's surplus bytes unread, so a reset may follow
		// the refusal; the refusal itself must arrive.
		got, err := io.ReadAll(conn)
		if err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("%s: waiting for the refusal: %v (after %q)", s.name, err, got)
		}
		h, perr := parseHeader(got[:min(len(got), headerLen)])
		if len(got) < headerLen || perr != nil || h.kind != kindAbort || !strings.Contains(string(got[headerLen:]), s.want) {
			t.Fatalf("%s: refused with %q, want an abort frame saying %q", s.name, got, s.want)
		}
	}
	silent := dial() // says nothing: must not hold up the world
	start(2)
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: New with strangers around: %v", r, err)
		}
	}
	// The silent stranger is dropped once the world is built, not at its hello deadline.
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := silent.Read(make([]byte, 64)); err == nil || isTimeout(err) {
		t.Fatalf("silent stranger: read %v, want the connection closed", err)
	}
	data := make([][]float32, n)
	var opWG sync.WaitGroup
	for r := range n {
		data[r] = []float32{float32(r), 1}
		opWG.Go(func() { errs[r] = comms[r].Allreduce(t.Context(), data[r], Sum) })
	}
	opWG.Wait()
	for r := range n {
		if errs[r] != nil || data[r][0] != 3 || data[r][1] != 3 {
			t.Fatalf("rank %d: Allreduce after the strangers: %v %v", r, data[r], errs[r])
		}
	}
}

// TestSecret: ranks with the same secret connect; with a rank that has another secret, or
// none, New fails on every rank, and both that rank and a rank that refused it say why.
func TestSecret(t *testing.T) {
	const n = 3
	good := []byte("job secret: 0123456789abcdef")
	cases := []struct {
		name   string
		odd    int    // rank with a different secret; -1 for none
		secret []byte // its secret
	}{
		{"same", -1, nil},
		{"wrong on a dialling rank", 2, []byte("job secret: fedcba9876543210")},
		{"missing on a dialling rank", 2, nil},
		{"wrong on an accepting rank", 0, []byte("job secret: fedcba9876543210")},
		{"missing on an accepting rank", 0, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := NewMemStore()
			const timeout = time.Second // how long the ranks that never hear why wait
			comms := make([]*Comm, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			begin := time.Now()
			for r := range n {
				wg.Go(func() {
					cfg := Config{Rank: r, Size: n, Generation: fakeGen, Store: store, Timeout: timeout, Secret: good, Logger: logTo(t)}
					if r == tc.odd {
						cfg.Secret = tc.secret
					}
					comms[r], errs[r] = New(t.Context(), cfg)
				})
			}
			wg.Wait()
			t.Cleanup(func() {
				for _, c := range comms {
					if c != nil {
						c.Close()
					}
				}
			})
			if d := time.Since(begin); d > timeout+2*time.Second {
				t.Errorf("New took %v with timeout %v", d, timeout)
			}
			says := func(err error) bool {
				return err != nil && (strings.Contains(err.Error(), "MAC") || strings.Contains(err.Error(), "secret"))
			}
			saying := 0
			for r, err := range errs {
				t.Logf("rank %d: %v", r, err)
				switch {
				case tc.odd < 0 && err != nil:
					t.Errorf("rank %d: %v", r, err)
				case tc.odd < 0:
				case err == nil:
					t.Errorf("rank %d joined a world with a mismatched secret", r)
				case says(err):
					saying++
				case r == tc.odd:
					t.Errorf("rank %d, the one with the other secret: %q does not mention the MAC or the secret", r, err)
				}
			}
			// A rank that refused a hello says why too (a rank that never saw one cannot).
			if tc.odd >= 0 && saying < 2 {
				t.Errorf("only %d ranks' errors mention the MAC or the secret", saying)
			}
			if tc.odd < 0 && !t.Failed() {
				ins := make([][]float32, n)
				for r := range n {
					ins[r] = []float32{float32(r)}
					wg.Go(func() { errs[r] = comms[r].Allreduce(t.Context(), ins[r], Sum) })
				}
				wg.Wait()
				for r := range n {
					if errs[r] != nil || ins[r][0] != 3 {
						t.Errorf("rank %d: authenticated Allreduce: %v, %v", r, ins[r], errs[r])
					}
				}
			}
		})
	}
}

// FuzzParseHeader: any 40 bytes either fail to parse or round-trip exactly.
func FuzzParseHeader(f *testing.F) {
	seed := func(h header) []byte {
		b := make([]byte, headerLen)
		h.put(b)
		return b
	}
	f.Add(seed(header{kind: kindHello, gen: 1, total: 4, unit: 3}))
	f.Add(seed(header{kind: kindData, op: opAllreduce | uint8(Sum), dtype: uint8(dtFloat32), gen: 9, seq: 2, total: 400, unit: 1, length: 200}))
	f.Add(seed(header{kind: kindAbort, unit: 2, length: 0xFFFFFFFF}))
	f.Add(make([]byte, headerLen))
	f.Add(bytes.Repeat([]byte{0xff}, headerLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < headerLen {
			return
		}
		b = b[:headerLen]
		h, err := parseHeader(b)
		if err != nil {
			return
		}
		if h.kind < kindHello || h.kind > kindRehello {
			t.Fatalf("accepted kind %d", h.kind)
		}
		out := make([]byte, headerLen)
		h.put(out)
		if !bytes.Equal(out, b) {
			t.Fatalf("%x parsed as %+v, which encodes as %x", b, h, out)
		}
	})
}

// FuzzRecv feeds arbitrary bytes from a peer into the receive path: it never panics, never
// allocates from what the peer claims, succeeds only on exactly the expected frame, and
// otherwise fails with ErrProtocol or ErrPeerLost.
func FuzzRecv(f *testing.F) {
	o := &opInfo{code: opAllreduce | uint8(Sum), dtype: dtFloat32, seq: 3, total: 16}
	const unit = 1
	want := header{kind: kindData, op: o.code, dtype: uint8(o.dtype), gen: fakeGen, seq: o.seq, total: o.total, unit: unit, length: 8}
	good := frameBytes(want, []byte("payload!"))
	f.Add(good)
	f.Add(good[:headerLen+3])
	f.Add(good[:10])
	f.Add(frameBytes(header{kind: kindAbort, unit: 0, length: 5}, []byte("gone!")))
	f.Add(frameBytes(header{kind: kindAbort, unit: 0, length: 0xFFFFFFFF}, nil))
	f.Add(frameBytes(header{kind: kindData, gen: fakeGen, seq: 3, length: 0xFFFFFFFF}, nil))
	f.Add([]byte{})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer ln.Close()
	f.Fuzz(func(t *testing.T, in []byte) {
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		server, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer server.Close()
		go func() {
			client.Write(in)
			client.(*net.TCPConn).CloseWrite()
		}()
		c := &Comm{cfg: Config{Rank: 0, Size: 2, Generation: fakeGen, Timeout: 5 * time.Second}.withDefaults(), peers: make([]*peer, 2)}
		p := &peer{rank: 1, conn: server.(*net.TCPConn)}
		c.peers[1] = p
		dst := make([]byte, 8)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err = c.recv(p, o, unit, dst)
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; d > 64<<10 {
			t.Fatalf("recv allocated %d bytes", d)
		}
		exact := len(in) >= len(good) && bytes.Equal(in[:headerLen], good[:headerLen])
		switch {
		case exact && err != nil:
			t.Fatalf("recv of the expected frame: %v", err)
		case exact && !bytes.Equal(dst, in[headerLen:len(good)]):
			t.Fatalf("recv delivered %q", dst)
		case !exact && err == nil:
			t.Fatalf("recv accepted %x", in)
		case !exact && !errors.Is(err, ErrProtocol) && !errors.Is(err, ErrPeerLost):
			t.Fatalf("recv of %x: %v wraps neither ErrProtocol nor ErrPeerLost", in, err)
		case err != nil && strings.Contains(err.Error(), "silent"):
			t.Fatalf("recv timed out on %x instead of reading a closed stream: %v", in, err)
		}
	})
}
