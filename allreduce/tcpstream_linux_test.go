package allreduce

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// loopbackPair is a connected pair of TCP sockets over loopback, with small buffers so that
// a few hundred KiB fill them.
func loopbackPair(t *testing.T) (w, r *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a := <-accepted
	if a == nil {
		t.Fatal("accept failed")
	}
	w, r = d.(*net.TCPConn), a.(*net.TCPConn)
	t.Cleanup(func() { w.Close(); r.Close() })
	if err := w.SetWriteBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if err := r.SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	return w, r
}

// withFds runs f with both connections' descriptors, as tcpStream reaches them.
func withFds(t *testing.T, w, r *net.TCPConn, f func(wfd, rfd int)) {
	t.Helper()
	wc, err := w.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := r.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var inner error
	err = wc.Control(func(wfd uintptr) {
		inner = rc.Control(func(rfd uintptr) { f(int(wfd), int(rfd)) })
	})
	if err != nil || inner != nil {
		t.Fatal(err, inner)
	}
}

// TestRawSocketCalls checks readNow and writevNow, the raw system calls tcpStream moves its
// bytes with, on real non-blocking TCP sockets: a frame several times the socket buffers
// arrives whole and in order through partial writes and reads, a full socket answers
// EAGAIN and an empty one (0, nil), a frame with an empty payload writes its header only,
// no iovec keeps a user buffer after a call, the peer's close reads as io.EOF, and a bad
// descriptor is an error.
func TestRawSocketCalls(t *testing.T) {
	w, r := loopbackPair(t)
	hdr := []byte("0123456789abcdef0123456789abcdef01234567")
	payload := make([]byte, 3<<20)
	for i := range payload {
		payload[i] = byte(rand.IntN(256))
	}
	want := append(append([]byte(nil), hdr...), payload...)
	got := make([]byte, len(want)+100) // room for more than was sent: a read must stop at it

	withFds(t, w, r, func(wfd, rfd int) {
		if n, err := readNow(rfd, got); n != 0 || err != nil {
			t.Errorf("readNow on an empty socket = %d, %v; want 0, nil", n, err)
		}
		var vec [2]unix.Iovec
		frame := [][]byte{hdr, payload}
		done, full, empty := 0, 0, 0
		deadline := time.Now().Add(20 * time.Second)
		// Each round writes until the socket is full, then reads until it is empty.
		for (frame != nil || done < len(want)) && time.Now().Before(deadline) {
			for frame != nil {
				n, err := writevNow(wfd, frame, &vec)
				if vec != ([2]unix.Iovec{}) {
					t.Fatal("writevNow left its iovecs pointing at the frame")
				}
				if errors.Is(err, unix.EAGAIN) {
					full++
					break
				}
				if err != nil {
					t.Fatalf("writevNow: %v", err)
				}
				frame = advance(frame, n)
			}
			for done < len(want) {
				n, err := readNow(rfd, got[done:])
				if err != nil {
					t.Fatalf("readNow after %d bytes: %v", done, err)
				}
				if n == 0 {
					empty++
					break
				}
				done += n
			}
		}
		if frame != nil || done != len(want) {
			t.Fatalf("after 20 s: %d of %d bytes read, frame written: %v", done, len(want), frame == nil)
		}
		if !bytes.Equal(got[:done], want) {
			t.Fatal("the bytes read differ from the frame written")
		}
		if full == 0 || empty == 0 {
			t.Errorf("%d bytes through 64 KiB socket buffers: the writer found the socket full %d times, the reader found it empty %d times; want both", len(want), full, empty)
		}
		t.Logf("%d bytes: the writer found the socket full %d times, the reader found it empty %d times", len(want), full, empty)

		// A frame with an empty payload is its header alone.
		n, err := writevNow(wfd, [][]byte{hdr, {}}, &vec)
		if n != len(hdr) || err != nil {
			t.Fatalf("writevNow(header, empty payload) = %d, %v; want %d, nil", n, err, len(hdr))
		}
		for done = 0; done < len(hdr) && time.Now().Before(deadline); {
			n, err := readNow(rfd, got[done:len(hdr)])
			if err != nil {
				t.Fatal(err)
			}
			done += n
		}
		if !bytes.Equal(got[:done], hdr) {
			t.Fatalf("read %q, want the header %q", got[:done], hdr)
		}
	})

	// The peer's close is the end of the stream.
	w.Close()
	withFds(t, r, r, func(_, rfd int) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			n, err := readNow(rfd, got)
			if errors.Is(err, io.EOF) {
				return
			}
			if n != 0 || err != nil || time.Now().After(deadline) {
				t.Fatalf("readNow after the peer closed = %d, %v; want io.EOF", n, err)
			}
			time.Sleep(time.Millisecond)
		}
	})

	if _, err := readNow(-1, got); !errors.Is(err, syscall.EBADF) {
		t.Errorf("readNow(-1) = %v, want EBADF", err)
	}
	if _, err := writevNow(-1, [][]byte{hdr}, new([2]unix.Iovec)); !errors.Is(err, syscall.EBADF) {
		t.Errorf("writevNow(-1) = %v, want EBADF", err)
	}
}
