package agents_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
)

// A driver of tens of thousands of workers holds no goroutine per worker: a process started
// through an agent is an entry in the registry, whose exit is told by a callback
// (proc.ExitNotifier), and whose launch context is watched without a goroutine.
func TestProcessesHoldNoGoroutine(t *testing.T) {
	e := newEnv(t, nil)
	a := e.client(t, secret).register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1", Slots: 8})
	const n = 500
	runtime.GC()
	before := runtime.NumGoroutine()
	var exited atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var ps []proc.Process
	for i := range n {
		p, err := e.reg.Launcher().Start(ctx, proc.Spec{Name: "w", Host: "10.0.0.1", Slot: i % 8, Command: []string{"train"}})
		if err != nil {
			t.Fatal(err)
		}
		n, ok := p.(proc.ExitNotifier)
		if !ok {
			t.Fatalf("%T is not a proc.ExitNotifier", p)
		}
		n.OnExit(func() { exited.Add(1) })
		ps = append(ps, p)
	}
	if grown := runtime.NumGoroutine() - before; grown > n/10 {
		t.Fatalf("%d running workers added %d goroutines; want none per worker", n, grown)
	}

	// Their exits, as the agent tells them, run the callbacks; one registered after the exit
	// runs at once.
	var evs []protocol.AgentEvent
	for i := range n {
		evs = append(evs, protocol.AgentEvent{Kind: protocol.KindExited, Proc: uint64(i + 1), Code: 0})
	}
	a.emit(t, evs...)
	deadline := time.Now().Add(5 * time.Second)
	for exited.Load() < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := exited.Load(); got != n {
		t.Fatalf("%d of %d exit callbacks ran", got, n)
	}
	late := make(chan struct{})
	ps[0].(proc.ExitNotifier).OnExit(func() { close(late) })
	select {
	case <-late:
	case <-time.After(5 * time.Second):
		t.Fatal("a callback registered after the exit did not run")
	}
	// An exited worker's context ending asks its agent for nothing.
	cancel()
	if cmds := a.poll(t, uint64(n), 100); len(cmds) != 0 {
		t.Errorf("the launch context's end after the exits queued %d commands (%v); want none", len(cmds), cmds[0].Op)
	}
}
