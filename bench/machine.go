package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"
)

// machine holds the limits of this machine that allreduce results are compared with,
// measured in the same run.
type machine struct {
	memcpyGbps float64 // one core copying a buffer far larger than the caches
	tcpGbps    float64 // one loopback TCP stream between two processes
	rttS       float64 // one 8-byte loopback TCP round trip between two processes
}

func measureMachine(ctx context.Context, self string, stderr io.Writer) (machine, error) {
	var m machine
	m.memcpyGbps = measureMemcpy(256<<20, 7)
	peer, addr, err := startPeer(ctx, self, stderr)
	if err != nil {
		return m, err
	}
	defer func() { peer.Process.Kill(); peer.Wait() }()
	if m.tcpGbps, err = measureTCP(ctx, addr, 1<<30, 5); err != nil {
		return m, fmt.Errorf("loopback TCP stream: %w", err)
	}
	if m.rttS, err = measureRTT(ctx, addr, 2000); err != nil {
		return m, fmt.Errorf("loopback round trip: %w", err)
	}
	return m, nil
}

// measureMemcpy returns the median single-core copy bandwidth in GB/s.
func measureMemcpy(size, runs int) float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in
	rates := make([]float64, runs)
	for i := range rates {
		t0 := time.Now()
		copy(dst, src)
		rates[i] = float64(size) / time.Since(t0).Seconds() / 1e9
	}
	return median(rates)
}

// startPeer runs `elasticd bench peer` (Peer), which prints its loopback address.
func startPeer(ctx context.Context, self string, stderr io.Writer) (*exec.Cmd, string, error) {
	cmd := exec.CommandContext(ctx, self, "bench", PeerCommand)
	cmd.SysProcAttr = childProcAttr()
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start bench peer: %w", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, "", fmt.Errorf("bench peer printed no address: %w", err)
	}
	return cmd, strings.TrimSpace(line), nil
}

// measureTCP streams total bytes to the peer `runs` times; each run ends when the peer
// confirms it received them all. Returns the median in GB/s.
func measureTCP(ctx context.Context, addr string, total int64, runs int) (float64, error) {
	buf := make([]byte, 1<<20)
	rates := make([]float64, runs)
	for i := range rates {
		conn, err := dialPeer(ctx, addr, 's')
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		for sent := int64(0); sent < total; sent += int64(len(buf)) {
			if _, err := conn.Write(buf); err != nil {
				conn.Close()
				return 0, err
			}
		}
		conn.(*net.TCPConn).CloseWrite()
		var got [8]byte
		if _, err := io.ReadFull(conn, got[:]); err != nil {
			conn.Close()
			return 0, err
		}
		rates[i] = float64(total) / time.Since(t0).Seconds() / 1e9
		conn.Close()
		if n := int64(binary.LittleEndian.Uint64(got[:])); n != total {
			return 0, fmt.Errorf("peer received %d bytes of %d", n, total)
		}
	}
	return median(rates), nil
}

// measureRTT returns the median time of an 8-byte ping-pong with the peer.
func measureRTT(ctx context.Context, addr string, rounds int) (float64, error) {
	conn, err := dialPeer(ctx, addr, 'p')
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var b [8]byte
	times := make([]float64, rounds)
	for i := range times {
		t0 := time.Now()
		if _, err := conn.Write(b[:]); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(conn, b[:]); err != nil {
			return 0, err
		}
		times[i] = time.Since(t0).Seconds()
	}
	return median(times[rounds/10:]), nil // the first tenth warms up
}

func dialPeer(ctx context.Context, addr string, mode byte) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := conn.Write([]byte{mode}); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// PeerCommand is the hidden subcommand of `elasticd bench` that runs Peer.
const PeerCommand = "peer"

// Peer is the other end of the TCP measurements, run by Allreduce as `Exe bench peer`; not
// for people. It prints its loopback address to out and serves until ctx ends (its parent
// kills it or stops it by signal).
func Peer(ctx context.Context, out io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Fprintln(out, ln.Addr().String())
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
	)
	// On the way out: no more connections, the open ones closed, and their servers waited for.
	defer func() {
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return nil
		}
		mu.Lock()
		conns[conn] = true
		mu.Unlock()
		wg.Go(func() {
			servePeer(conn)
			mu.Lock()
			delete(conns, conn)
			mu.Unlock()
		})
	}
}

func servePeer(conn net.Conn) {
	defer conn.Close()
	var mode [1]byte
	if _, err := io.ReadFull(conn, mode[:]); err != nil {
		return
	}
	switch mode[0] {
	case 's': // sink: count until EOF, answer the count
		n, _ := io.Copy(io.Discard, conn)
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(n))
		conn.Write(b[:])
	case 'p': // ping-pong
		var b [8]byte
		for {
			if _, err := io.ReadFull(conn, b[:]); err != nil {
				return
			}
			if _, err := conn.Write(b[:]); err != nil {
				return
			}
		}
	}
}
