package agent

import (
	"fmt"
	"sync"

	"github.com/elasticd/elasticd/protocol"
)

const (
	// maxPendingOutput bounds the worker output held for a driver that is slow or away;
	// beyond it output is dropped, and the driver is told how much.
	maxPendingOutput = 4 << 20
	// maxChunk is the most output one event carries.
	maxChunk = 64 << 10
	// maxBatch and maxBatchBytes bound one events request.
	maxBatch      = 256
	maxBatchBytes = 2 << 20
)

// outbox holds the events of one session until the driver has taken them, numbered in
// order. Output is coalesced into few events and bounded; every other event is kept.
type outbox struct {
	mu      sync.Mutex
	seq     uint64
	events  []item
	outSize int            // bytes of output in events
	dropped map[stream]int // output bytes dropped per stream since the last that got through
	wake    chan struct{}
}

// stream is one output stream ("stdout" or "stderr") of one process.
type stream struct {
	proc uint64
	name string
}

// item is a queued event; a sealed one has been sent and must not grow.
type item struct {
	ev     protocol.AgentEvent
	sealed bool
}

func newOutbox() *outbox {
	return &outbox{dropped: map[stream]int{}, wake: make(chan struct{}, 1)}
}

func (o *outbox) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// add queues an event.
func (o *outbox) add(ev protocol.AgentEvent) {
	o.mu.Lock()
	o.seq++
	ev.Seq = o.seq
	o.events = append(o.events, item{ev: ev})
	o.mu.Unlock()
	o.signal()
}

// output queues a piece of a process's output.
func (o *outbox) output(proc uint64, name string, p []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	key := stream{proc, name}
	if o.outSize+len(p) > maxPendingOutput {
		o.dropped[key] += len(p)
		return
	}
	if n := o.dropped[key]; n > 0 {
		delete(o.dropped, key)
		o.appendOutput(proc, name, fmt.Appendf(nil, "\n[elasticd agent: %d bytes of output dropped: the driver was not taking them]\n", n))
	}
	o.appendOutput(proc, name, p)
	o.signal()
}

func (o *outbox) appendOutput(proc uint64, stream string, p []byte) {
	for len(p) > 0 {
		if n := len(o.events); n > 0 {
			last := &o.events[n-1].ev
			if !o.events[n-1].sealed && last.Kind == protocol.KindOutput && last.Proc == proc && last.Stream == stream && len(last.Data) < maxChunk {
				k := min(len(p), maxChunk-len(last.Data))
				last.Data = append(last.Data, p[:k]...)
				o.outSize += k
				p = p[k:]
				continue
			}
		}
		k := min(len(p), maxChunk)
		o.seq++
		o.events = append(o.events, item{ev: protocol.AgentEvent{Seq: o.seq, Kind: protocol.KindOutput, Proc: proc, Stream: stream, Data: append([]byte(nil), p[:k]...)}})
		o.outSize += k
		p = p[k:]
	}
}

// batch returns the oldest events to send, and the sequence number of the last. The events
// are copies: output may still be appended to the last one while the batch is in flight, so
// a sent event is never changed afterwards (see ack).
func (o *outbox) batch() ([]protocol.AgentEvent, uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []protocol.AgentEvent
	size := 0
	for _, it := range o.events {
		ev := it.ev
		if len(out) >= maxBatch || (len(out) > 0 && size+len(ev.Data) > maxBatchBytes) {
			break
		}
		ev.Data = append([]byte(nil), ev.Data...)
		out = append(out, ev)
		size += len(ev.Data)
	}
	if len(out) == 0 {
		return nil, 0
	}
	// Seal the batch: later output must start a new event, or a retry of this batch would
	// carry more than the driver took the first time.
	o.events[len(out)-1].sealed = true
	return out, out[len(out)-1].Seq
}

// unackedExits are the processes whose exit is queued and not yet taken by the driver.
func (o *outbox) unackedExits() map[uint64]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[uint64]bool{}
	for _, it := range o.events {
		if it.ev.Kind == protocol.KindExited {
			out[it.ev.Proc] = true
		}
	}
	return out
}

// ack forgets the events up to seq, which the driver has taken.
func (o *outbox) ack(seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := 0
	for i < len(o.events) && o.events[i].ev.Seq <= seq {
		o.outSize -= len(o.events[i].ev.Data)
		i++
	}
	o.events = o.events[i:]
	if len(o.events) == 0 {
		o.events = nil
	}
}

// pending reports whether events wait to be sent.
func (o *outbox) pending() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.events) > 0
}

// takeOutput removes and returns the output events of proc not yet taken by the driver (a
// session's end hands a held worker's output to the next session).
func (o *outbox) takeOutput(proc uint64) []protocol.AgentEvent {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []protocol.AgentEvent
	kept := o.events[:0]
	for _, it := range o.events {
		if it.ev.Kind == protocol.KindOutput && it.ev.Proc == proc {
			out = append(out, it.ev)
			o.outSize -= len(it.ev.Data)
			continue
		}
		kept = append(kept, it)
	}
	o.events = kept
	return out
}
