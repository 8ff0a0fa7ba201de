package driver

import (
	"fmt"
	"testing"
	"time"

	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// The state machine's own cost at scale: one reset of a job of hosts × 8 workers (a worker
// fails, every other reports READY, the next generation is planned), and a mass reclaim
// (a tenth of the hosts given notices, every worker at the barrier, the next generation).
// Each Step is followed by NextDeadline, as the runner's loop does. No I/O: this is what the
// driver's loop spends, apart from HTTP.
//
//	go test -run '^$' -bench MachineScale -benchtime 3x ./driver/
func BenchmarkMachineScale(b *testing.B) {
	for _, hosts := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("hosts=%d/reset", hosts), func(b *testing.B) { benchMachine(b, hosts, false) })
		b.Run(fmt.Sprintf("hosts=%d/reclaim", hosts), func(b *testing.B) { benchMachine(b, hosts, true) })
	}
}

func benchMachine(b *testing.B, nHosts int, reclaim bool) {
	const slots = 8
	n := nHosts * slots
	for b.Loop() {
		b.StopTimer()
		now := t0
		m := NewMachine(Config{NP: n, MinNP: n / 2, MaxNP: n, Mode: ModeInProcess})
		step := func(e Event) []Action {
			acts := m.Step(e)
			m.NextDeadline(now)
			return acts
		}
		var hs []providers.Host
		for i := range nHosts {
			hs = append(hs, providers.Host{ID: fmt.Sprintf("h%05d", i), Addr: fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&255, i&255), Slots: slots})
		}
		step(HostsDiscovered{Now: now, Hosts: hs})
		var ids []protocol.WorkerID
		for _, h := range hs {
			for s := range slots {
				id := protocol.WorkerID{Host: h.ID, Slot: s}
				ids = append(ids, id)
				step(WorkerStarted{Now: now, Worker: id, Generation: 1})
				step(WorkerReported{Now: now, Worker: id, Generation: 0, State: protocol.Ready})
			}
		}
		if m.gen != 1 || len(m.plan) != n {
			b.Fatalf("generation %d with %d workers, want 1 with %d", m.gen, len(m.plan), n)
		}
		now = now.Add(time.Second)
		b.StartTimer()

		gone := map[string]bool{}
		if reclaim {
			for i := range nHosts / 10 {
				h := hs[i].ID
				gone[h] = true
				step(NoticeReceived{Now: now, Notice: providers.Notice{ID: "n-" + h, HostID: h, Kind: providers.Interruption, Deadline: now.Add(2 * time.Minute)}})
			}
		} else {
			gone[ids[n-1].Host] = true
			step(WorkerExited{Now: now, Worker: ids[n-1], Code: 1})
		}
		var acts []Action
		for _, id := range ids {
			if !reclaim && id == ids[n-1] {
				continue
			}
			acts = append(acts, step(WorkerReported{Now: now, Worker: id, Generation: 1, State: protocol.Ready})...)
		}
		b.StopTimer()
		if m.gen != 2 {
			b.Fatalf("generation %d after the barrier, want 2", m.gen)
		}
		for id := range m.plan {
			if reclaim && gone[id.Host] || !reclaim && id == ids[n-1] {
				b.Fatalf("%s is in generation 2", id)
			}
		}
		_ = acts
		b.StartTimer()
	}
}
