package allreduce

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// A host answers a probe when something listens on the port, and also when nothing does any
// more (it refuses): only silence, or the network saying it cannot reach the host, is a cut.
func TestProbeHostsCountsRefusalsAsAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	got := probeHosts(t.Context(), map[int]string{0: ln.Addr().String(), 1: closedAddr}, time.Second)
	if len(got) != 0 {
		t.Fatalf("unreachable %v: a listener and a refused port both answer", got)
	}
}

func TestUnreachableErrors(t *testing.T) {
	dial := func(errno syscall.Errno) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errno)}
	}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{dial(syscall.ECONNREFUSED), false},
		{dial(syscall.ECONNRESET), false},
		{dial(syscall.EMFILE), false},
		{dial(syscall.EHOSTUNREACH), true},
		{dial(syscall.ENETUNREACH), true},
		{dial(syscall.EINVAL), true}, // a blackhole route
		{dial(syscall.EACCES), true}, // a prohibit route, a firewall
		{fmt.Errorf("dial: %w", context.DeadlineExceeded), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}, true},
	} {
		if got := unreachable(tc.err); got != tc.want {
			t.Errorf("unreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	u := &UnreachableError{Ranks: []int{2}, Reached: []int{1}, Err: errors.New("waiting for peers [2]: context deadline exceeded")}
	wrapped := fmt.Errorf("allreduce: rank 0 of 3: %w", u)
	if un, re := Unreachable(wrapped); !errors.Is(wrapped, ErrPeerLost) || !errors.Is(wrapped, ErrPeerUnreachable) || len(un) != 1 || len(re) != 1 {
		t.Fatalf("%v: want ErrPeerLost, ErrPeerUnreachable, ranks [2] and reached [1]", wrapped)
	}
	if un, re := Unreachable(errors.New("other")); un != nil || re != nil {
		t.Fatal("ranks from an error that names none")
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
