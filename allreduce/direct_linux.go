package allreduce

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// readPeerMem copies len(dst) bytes at addr in process pid's memory into dst
// (process_vm_readv: one copy, by the kernel, with no buffer between the processes). The
// kernel allows it to a process that may ptrace the other: the same user, unless Yama's
// ptrace_scope or a seccomp filter forbids it (the handshake tries it first: directProbe).
func readPeerMem(pid int, addr uint64, dst []byte) error {
	for len(dst) > 0 {
		local := [1]unix.Iovec{{Base: &dst[0]}}
		local[0].SetLen(len(dst))
		remote := [1]unix.RemoteIovec{{Base: uintptr(addr), Len: len(dst)}}
		n, err := unix.ProcessVMReadv(pid, local[:], remote[:], 0)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n <= 0:
			return fmt.Errorf("process_vm_readv of %d bytes at %#x read nothing", len(dst), addr)
		}
		dst = dst[n:]
		addr += uint64(n)
	}
	return nil
}

// directProbe checks that this process can read want at addr in process pid.
func directProbe(pid int, addr uint64, want []byte) error {
	got := make([]byte, len(want))
	if err := readPeerMem(pid, addr, got); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return errors.New("read other bytes than the peer announced (another PID namespace?)")
	}
	return nil
}

// peerGone reports whether a failed read says the peer process has exited.
func peerGone(err error) bool { return errors.Is(err, syscall.ESRCH) }

// machineReadRatio is measureReadRatio's answer, measured once per process, the first time
// the process is rank 0 of a world that could read directly.
var machineReadRatio = sync.OnceValue(measureReadRatio)

// readProbeBytes is how much measureReadRatio copies each way: larger than a core's own
// caches, as the segments that directAllreduce reads are.
const readProbeBytes = 4 << 20

// measureReadRatio returns how fast process_vm_readv copies between two buffers of this
// process compared with copy (a plain memmove), as the ratio of their median times over
// fifteen interleaved tries of readProbeBytes; 0 when it cannot tell. The kernel's path is
// the same whether the memory is another process's or this one's: it pins the pages and
// copies them. Fifteen, because medians of five and best times of seven spread 0.51-0.83
// on a machine where medians of sixteen gave 0.73 and 0.77 (docs/design-notes/allreduce-tuning.md §12). It
// takes 5-15 ms, in memory of its own that it hands back.
func measureReadRatio() float64 {
	mem, err := unix.Mmap(-1, 0, 2*readProbeBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return 0
	}
	defer unix.Munmap(mem)
	src, dst := mem[:readProbeBytes], mem[readProbeBytes:]
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the destination's pages in too
	pid := os.Getpid()
	var reads, copies [15]time.Duration
	for i := range reads {
		t := time.Now()
		if err := readPeerMem(pid, addrOf(src), dst); err != nil {
			return 0
		}
		reads[i] = time.Since(t)
		t = time.Now()
		copy(dst, src)
		copies[i] = time.Since(t)
	}
	slices.Sort(reads[:])
	slices.Sort(copies[:])
	if mid := len(reads) / 2; reads[mid] > 0 {
		return float64(copies[mid]) / float64(reads[mid])
	}
	return 0
}
