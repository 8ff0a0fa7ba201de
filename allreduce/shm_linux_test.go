package allreduce

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// linkPair maps one segment twice, as two processes would: the creator's side and the
// acceptor's, at different addresses. Every wait gives up after a few seconds, so a lost
// wake-up fails the test instead of hanging it.
func linkPair(t *testing.T, ringSize int) (a, b *shmLink) {
	t.Helper()
	token := []byte("0123456789abcdef")
	seg, err := createSegment(ringSize, token)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.file.Close()
	mem, err := openSegment(os.Getpid(), int(seg.file.Fd()), ringSize, token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openSegment(os.Getpid(), int(seg.file.Fd()), ringSize, []byte("fedcba9876543210")); err == nil {
		t.Fatal("a segment opened with the wrong token")
	}
	a = newLink(seg.mem, true, unmapSegment)
	b = newLink(mem, false, unmapSegment)
	for _, l := range []*shmLink{a, b} {
		l.check = func(start time.Time) error {
			if time.Since(start) > 10*time.Second {
				return errors.New("waited 10s: a wake-up was lost")
			}
			return nil
		}
	}
	t.Cleanup(func() { a.release(); b.release() })
	return a, b
}

// TestShmRingStream sends frames of many sizes, from empty to several times the ring, one
// way while the other side reads them, copying or reducing in place, so the ring wraps at
// every offset; then the same the other way.
func TestShmRingStream(t *testing.T) {
	const ringSize = 64 << 10
	a, b := linkPair(t, ringSize)
	rng := rand.New(rand.NewPCG(1, 2))
	var sizes []int // float64 elements per frame
	for range 300 {
		switch rng.IntN(4) {
		case 0:
			sizes = append(sizes, rng.IntN(4))
		case 1:
			sizes = append(sizes, rng.IntN(1000))
		case 2:
			sizes = append(sizes, rng.IntN(3*ringSize/8))
		default:
			sizes = append(sizes, ringSize/8-5+rng.IntN(10))
		}
	}
	value := func(f, i int) float64 { return float64(f*7 + i%1000) }
	for _, dir := range []struct {
		name     string
		from, to *shmLink
	}{{"creator to acceptor", a, b}, {"acceptor to creator", b, a}} {
		t.Run(dir.name, func(t *testing.T) {
			var wg sync.WaitGroup
			var werr error
			wg.Go(func() {
				var hdr [headerLen]byte
				for f, n := range sizes {
					payload := make([]float64, n)
					for i := range payload {
						payload[i] = value(f, i)
					}
					binary.LittleEndian.PutUint64(hdr[:], uint64(n))
					pb, _, _ := asBytes(payload)
					if _, werr = dir.from.write(shmFrame(hdr[:], pb), true); werr != nil {
						return
					}
				}
			})
			var hdr [headerLen]byte
			for f, n := range sizes {
				if err := dir.to.read(hdr[:]); err != nil {
					t.Fatalf("frame %d: header: %v", f, err)
				}
				if got := int(binary.LittleEndian.Uint64(hdr[:])); got != n {
					t.Fatalf("frame %d: header says %d elements, sent %d", f, got, n)
				}
				dst := make([]float64, n)
				for i := range dst {
					dst[i] = 1
				}
				db, _, _ := asBytes(dst)
				var err error
				if f%2 == 0 {
					err = dir.to.reduce(db, dtFloat64, Sum)
				} else {
					err = dir.to.read(db)
				}
				if err == nil {
					err = dir.to.skipPad(headerLen + len(db))
				}
				if err != nil {
					t.Fatalf("frame %d of %d elements: %v", f, n, err)
				}
				for i, v := range dst {
					want := value(f, i)
					if f%2 == 0 {
						want++
					}
					if v != want {
						t.Fatalf("frame %d of %d elements: element %d is %v, want %v", f, n, i, v, want)
					}
				}
			}
			wg.Wait()
			if werr != nil {
				t.Fatal(werr)
			}
		})
	}
}

// TestShmRingFloat32Odd checks in-place reduction of float32 frames of odd lengths, whose
// padding keeps every later payload 8-byte aligned across the wrap.
func TestShmRingFloat32Odd(t *testing.T) {
	a, b := linkPair(t, 64<<10)
	var hdr, rhdr [headerLen]byte
	for f := range 200 {
		n := 1 + f*37%5001
		src := make([]float32, n)
		dst := make([]float32, n)
		for i := range src {
			src[i], dst[i] = float32(i), float32(f)
		}
		sb, _, _ := asBytes(src)
		db, _, _ := asBytes(dst)
		var wg sync.WaitGroup
		var werr error
		wg.Go(func() { _, werr = a.write(shmFrame(hdr[:], sb), true) })
		err := b.read(rhdr[:])
		if err == nil {
			err = b.reduce(db, dtFloat32, Sum)
		}
		if err == nil {
			err = b.skipPad(headerLen + len(db))
		}
		wg.Wait()
		if err != nil || werr != nil {
			t.Fatalf("frame %d: read %v, write %v", f, err, werr)
		}
		for i := range dst {
			if dst[i] != float32(i+f) {
				t.Fatalf("frame %d of %d: element %d is %v", f, n, i, dst[i])
			}
		}
	}
}

// TestShmWriteNoBlock: a write that must not block stops where the ring is full and says
// how far it got; the rest goes once the reader has made room.
func TestShmWriteNoBlock(t *testing.T) {
	const ringSize = 64 << 10
	a, b := linkPair(t, ringSize)
	payload := bytes.Repeat([]byte{7}, ringSize+1000)
	var hdr [headerLen]byte
	frame := shmFrame(hdr[:], payload)
	n, err := a.write(frame, false)
	if err != nil || n != ringSize {
		t.Fatalf("non-blocking write of %d bytes into a ring of %d: wrote %d, %v", headerLen+len(payload), ringSize, n, err)
	}
	if n, err := a.write(frame, false); err != nil || n != 0 {
		t.Fatalf("second non-blocking write into a full ring: wrote %d, %v", n, err)
	}
	got := make([]byte, headerLen+len(payload))
	var wg sync.WaitGroup
	var rerr error
	wg.Go(func() { rerr = b.read(got) })
	rest := [][]byte{payload[ringSize-headerLen:], frame[2]}
	if _, err := a.write(rest, true); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if rerr != nil || !bytes.Equal(got[headerLen:], payload) {
		t.Fatalf("read back: %v, equal %t", rerr, bytes.Equal(got[headerLen:], payload))
	}
}

// TestShmLastFrameBeforeClose: the race TestShmStreamDrainsClosedPeer leaves out. The peer
// writes its last frame and closes between this side's look at the ring and its look at the
// link, so the wait sees the close (or its check, the connection's end) with the frame
// unseen; it must take the frame. Found by the benchmark across hosts, two ranks per host:
// rank 1 reported rank 0 lost in the last allreduce of a run (once in eight runs).
// ready and check put the peer's moves exactly between the two looks.
func TestShmLastFrameBeforeClose(t *testing.T) {
	frame := []byte("the last frame, written before the peer closes")
	for _, how := range []string{"closed", "check"} {
		t.Run(how, func(t *testing.T) {
			a, b := linkPair(t, 64<<10)
			r := &b.rx
			peerDone := false
			peer := func() { // writes its last frame, then goes
				if _, err := a.write([][]byte{frame}, true); err != nil {
					t.Error(err)
				}
				if how == "closed" {
					a.shut()
				}
				peerDone = true
			}
			looks := 0
			ready := func() bool {
				looks++
				ok := r.head.Load()-r.pos >= uint64(len(frame))
				if how == "closed" && !peerDone {
					peer() // after the look: the frame arrives unseen, then the close
				}
				return ok
			}
			if how == "check" {
				check := b.check
				b.check = func(start time.Time) error {
					if !peerDone {
						peer() // between ready and check, as a peer that exits then
						return shmClosed{}
					}
					return check(start)
				}
			}
			if err := b.await(ready, r.dataSeq, r.dataWait); err != nil {
				t.Fatalf("the wait ended with %v after %d looks, with the frame in the ring", err, looks)
			}
			got := make([]byte, len(frame))
			if err := b.read(got); err != nil || !bytes.Equal(got, frame) {
				t.Fatalf("read %q, %v; want %q", got, err, frame)
			}
			// With nothing more to come, the next wait ends with the close.
			if how == "check" {
				a.shut()
			}
			if err := b.read(got[:1]); err == nil {
				t.Fatal("a read past the last frame of a closed peer returned nil")
			}
		})
	}
}

// TestShmShutWakesWaiter: a reader asleep on an empty ring returns as soon as the other side
// marks the link closed, long before its own checks would end the wait.
func TestShmShutWakesWaiter(t *testing.T) {
	a, b := linkPair(t, 64<<10)
	for _, name := range []string{"reader", "writer"} {
		t.Run(name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				if name == "reader" {
					done <- b.read(make([]byte, 10))
				} else {
					_, err := b.write([][]byte{make([]byte, 200<<10)}, true)
					done <- err
				}
			}()
			time.Sleep(100 * time.Millisecond) // long enough to be asleep; the test holds either way
			a.shut()
			select {
			case err := <-done:
				if _, ok := err.(shmClosed); !ok {
					t.Fatalf("woken with %v, want shmClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("not woken 5s after the link was closed")
			}
		})
	}
}

// TestShmBadOfferFallsBack: a fake rank 0 offers a segment that is not what it claims (a
// wrong token, then a file descriptor that does not exist); the real rank 1 declines, logs
// why, and its communicator is built over TCP all the same.
func TestShmBadOfferFallsBack(t *testing.T) {
	token := []byte("0123456789abcdef")
	seg, err := createSegment(64<<10, token)
	if err != nil {
		t.Fatal(err)
	}
	defer unmapSegment(seg.mem)
	defer seg.file.Close()
	offer := func(fd int, tok []byte) []byte {
		b := binary.LittleEndian.AppendUint32(nil, uint32(os.Getpid()))
		b = binary.LittleEndian.AppendUint32(b, uint32(fd))
		b = binary.LittleEndian.AppendUint64(b, 64<<10)
		return append(append(b, tok...), hostID()...)
	}
	for _, tc := range []struct {
		name  string
		offer []byte
	}{
		{"wrong token", offer(int(seg.file.Fd()), []byte("fedcba9876543210"))},
		{"no such descriptor", offer(1<<20, token)},
		{"another machine", append(offer(int(seg.file.Fd()), token)[:32], "not-this-boot"...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := NewMemStore()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			store.Set(ctx, addrKey(fakeGen, 0), []byte(ln.Addr().String()))
			store.Set(ctx, hostsKey(fakeGen), []byte("[0,1]")) // as rank 0 would: two hosts
			cfg := Config{Rank: 1, Size: 2, Generation: fakeGen, Store: store, Timeout: 10 * time.Second, Logger: logTo(t)}
			res := newAsync(ctx, cfg)
			nc, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			conn := nc.(*net.TCPConn)
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			if h, _ := readFrame(t, conn); h.kind != kindHello || h.unit != 1 {
				t.Fatalf("rank 1 opened with %+v", h)
			}
			if _, err := conn.Write(helloBytes(cfg.withDefaults(), 0)); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Write(frameBytes(header{kind: kindShm, gen: fakeGen, unit: 0, length: uint32(len(tc.offer))}, tc.offer)); err != nil {
				t.Fatal(err)
			}
			h, answer := readFrame(t, conn)
			if h.kind != kindShm || !bytes.Equal(answer, []byte{0}) {
				t.Fatalf("rank 1 answered a bad offer with %+v %v, want a refusal", h, answer)
			}
			r := <-res
			if r.err != nil {
				t.Fatalf("New: %v", r.err)
			}
			defer r.c.Close()
			if s := r.c.Stats(); s.SharedMemory != 0 || s.Fresh != 1 {
				t.Fatalf("stats %+v, want one fresh connection and no shared memory", s)
			}
			// Data now goes over the connection: a frame from the fake arrives there.
			data := []float32{1, 2}
			errc := make(chan error, 1)
			go func() { errc <- r.c.Allreduce(t.Context(), data, Sum) }()
			h, p := readFrame(t, conn)
			if _, err := conn.Write(frameBytes(h, make([]byte, len(p)))); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil || data[0] != 1 || data[1] != 2 {
				t.Fatalf("Allreduce over TCP after the refusal: %v, %v", err, data)
			}
		})
	}
}

// TestFutexWaitAny: a sleeper on two words wakes when either one is bumped and woken, and
// does not sleep at all when a word has already moved past the value it read.
func TestFutexWaitAny(t *testing.T) {
	a, _ := linkPair(t, 64<<10)
	words := []waitWord{{a.rx.dataSeq, a.rx.dataWait}, {a.tx.spaceSeq, a.tx.spaceWait}}
	for i, w := range words {
		t.Run(fmt.Sprintf("word%d", i), func(t *testing.T) {
			vals := []uint32{words[0].seq.Load(), words[1].seq.Load()}
			done := make(chan time.Duration, 1)
			go func() {
				start := time.Now()
				futexWaitAny(words, vals, 20*time.Second)
				done <- time.Since(start)
			}()
			time.Sleep(50 * time.Millisecond) // long enough to be asleep; the test holds either way
			w.seq.Add(1)
			futexWake(w.seq)
			select {
			case d := <-done:
				t.Logf("woken after %v", d)
			case <-time.After(5 * time.Second):
				t.Fatal("not woken 5s after the word was bumped")
			}
		})
	}
	t.Run("stale", func(t *testing.T) {
		vals := []uint32{words[0].seq.Load(), words[1].seq.Load() - 1}
		start := time.Now()
		futexWaitAny(words, vals, 20*time.Second)
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("slept %v on a word that had already changed", d)
		}
	})
}

// TestShmStreamDrainsClosedPeer: a peer that has written its last frame may close its side
// before this rank has read it (it is done); shmStream must still take what is in the ring.
// Found by the benchmark: rank 0 exited after the last collective while rank 1 was reading
// it, and rank 1 reported rank 0 lost.
func TestShmStreamDrainsClosedPeer(t *testing.T) {
	a, b := linkPair(t, 64<<10)
	c := &Comm{cfg: Config{Rank: 1, Size: 2, Generation: 7, Timeout: 5 * time.Second}.withDefaults()}
	p := &peer{rank: 0, shm: b}
	c.peers = []*peer{p, nil}
	o := &opInfo{code: opAllreduce | uint8(Sum), dtype: dtFloat64, seq: 3, total: 24}
	mine, theirs := []float64{1, 2, 3}, []float64{10, 20, 30}
	mb, _, _ := asBytes(mine)
	tb, _, _ := asBytes(theirs)
	var hdr [headerLen]byte
	h := header{kind: kindData, op: o.code, dtype: uint8(o.dtype), gen: 7, seq: o.seq, total: o.total, unit: 0, length: uint32(len(tb))}
	h.put(hdr[:])
	if _, err := a.write(shmFrame(hdr[:], tb), true); err != nil {
		t.Fatal(err)
	}
	a.shut()
	if err := c.shmStream(o, p, p, 0, nil, []unit{{buf: mb, after: -1, reduce: true}}, dtFloat64, Sum); err != nil {
		t.Fatalf("shmStream with the frame in the ring and the peer closed: %v", err)
	}
	if want := []float64{11, 22, 33}; !slices.Equal(mine, want) {
		t.Fatalf("got %v, want %v", mine, want)
	}
}
