package agent

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/elasticd/elasticd/protocol"
)

// outboxAll takes every queued event, batch after batch, acknowledging each.
func outboxAll(t *testing.T, o *outbox) []protocol.AgentEvent {
	t.Helper()
	var all []protocol.AgentEvent
	for o.pending() {
		evs, last := o.batch()
		if len(evs) == 0 || last != evs[len(evs)-1].Seq {
			t.Fatalf("batch() = %d events, last %d, with events pending", len(evs), last)
		}
		all = append(all, evs...)
		o.ack(last)
	}
	return all
}

// outboxSeqs checks that evs are numbered first, first+1, ...
func outboxSeqs(t *testing.T, evs []protocol.AgentEvent, first uint64) {
	t.Helper()
	for i, ev := range evs {
		if ev.Seq != first+uint64(i) {
			t.Fatalf("event %d has seq %d, want %d (events %+v)", i, ev.Seq, first+uint64(i), evs)
		}
	}
}

func outboxWoken(o *outbox) bool {
	select {
	case <-o.wake:
		return true
	default:
		return false
	}
}

func TestOutboxNumbersEventsInOrder(t *testing.T) {
	o := newOutbox()
	if o.pending() || outboxWoken(o) {
		t.Fatal("a new outbox has events pending or is woken")
	}
	if evs, last := o.batch(); evs != nil || last != 0 {
		t.Fatalf("batch() of an empty outbox = %+v, %d", evs, last)
	}
	o.add(protocol.AgentEvent{Kind: protocol.KindStarted, Proc: 1, PID: 10})
	if !outboxWoken(o) {
		t.Error("add did not wake the sender")
	}
	o.output(1, "stdout", []byte("a"))
	if !outboxWoken(o) {
		t.Error("output did not wake the sender")
	}
	o.add(protocol.AgentEvent{Kind: protocol.KindNotice, Notice: &protocol.AgentNotice{ID: "n"}})
	o.output(1, "stdout", []byte("b"))
	o.add(protocol.AgentEvent{Kind: protocol.KindExited, Proc: 1, Code: 3})

	evs := outboxAll(t, o)
	outboxSeqs(t, evs, 1)
	var kinds []string
	for _, ev := range evs {
		kinds = append(kinds, ev.Kind+":"+string(ev.Data))
	}
	if got, want := strings.Join(kinds, " "), "started: output:a notice: output:b exited:"; got != want {
		t.Errorf("events %q, want %q", got, want)
	}
	// Numbering goes on after an ack.
	o.add(protocol.AgentEvent{Kind: protocol.KindStarted, Proc: 2})
	if evs, last := o.batch(); len(evs) != 1 || last != 6 {
		t.Errorf("after 5 events and an ack: batch() = %+v, %d; want seq 6", evs, last)
	}
}

func TestOutboxCoalescesOutput(t *testing.T) {
	o := newOutbox()
	o.output(1, "stdout", []byte("ab"))
	o.output(1, "stdout", []byte("cd"))
	o.output(1, "stderr", []byte("E"))
	o.output(2, "stdout", []byte("x"))
	o.output(1, "stdout", []byte("ef"))
	o.output(1, "stdout", []byte("gh"))

	evs := outboxAll(t, o)
	outboxSeqs(t, evs, 1)
	var got []string
	for _, ev := range evs {
		got = append(got, fmt.Sprintf("%d/%s:%s", ev.Proc, ev.Stream, ev.Data))
	}
	if want := []string{"1/stdout:abcd", "1/stderr:E", "2/stdout:x", "1/stdout:efgh"}; !reflect.DeepEqual(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}

	// A long write fills the open event up to maxChunk and goes on in new events.
	o.output(3, "stdout", []byte("head"))
	big := bytes.Repeat([]byte("0123456789"), (2*maxChunk+500)/10)
	o.output(3, "stdout", big)
	evs = outboxAll(t, o)
	outboxSeqs(t, evs, 5)
	var joined []byte
	for i, ev := range evs {
		if ev.Kind != protocol.KindOutput || ev.Proc != 3 || ev.Stream != "stdout" {
			t.Fatalf("event %d: %+v", i, ev)
		}
		if i < len(evs)-1 && len(ev.Data) != maxChunk {
			t.Errorf("event %d carries %d bytes, want a full chunk of %d", i, len(ev.Data), maxChunk)
		}
		if len(ev.Data) > maxChunk {
			t.Errorf("event %d carries %d bytes, more than maxChunk", i, len(ev.Data))
		}
		joined = append(joined, ev.Data...)
	}
	if want := append([]byte("head"), big...); !bytes.Equal(joined, want) {
		t.Errorf("output of %d bytes came out as %d bytes, or altered", len(want), len(joined))
	}
	if want := (len(big) + 4 + maxChunk - 1) / maxChunk; len(evs) != want {
		t.Errorf("%d events, want %d", len(evs), want)
	}
}

func TestOutboxSealsBatch(t *testing.T) {
	o := newOutbox()
	o.output(1, "stdout", []byte("first"))
	b1, last := o.batch()
	if len(b1) != 1 || last != 1 {
		t.Fatalf("batch() = %+v, %d", b1, last)
	}
	// Output while the batch is in flight must not change what a retry sends.
	o.output(1, "stdout", []byte("second"))
	o.output(1, "stdout", []byte("third"))
	b2, last2 := o.batch()
	if len(b2) != 2 || !reflect.DeepEqual(b2[0], b1[0]) || string(b2[0].Data) != "first" {
		t.Fatalf("retried batch %+v, want the first event unchanged, then the new output", b2)
	}
	if b2[1].Seq != 2 || string(b2[1].Data) != "secondthird" || last2 != 2 {
		t.Errorf("new output: %+v (last %d), want seq 2 carrying secondthird", b2[1], last2)
	}
	// The batch is a copy: the sender may not change the outbox through it.
	b2[1].Data[0] = 'X'
	if b3, _ := o.batch(); string(b3[1].Data) != "secondthird" {
		t.Errorf("changing a batch changed the outbox: %q", b3[1].Data)
	}
	// The sealed event stays as sent; the next output opens a new event.
	o.ack(1)
	o.output(1, "stdout", []byte("fourth"))
	b4, last4 := o.batch()
	if len(b4) != 2 || string(b4[0].Data) != "secondthird" || string(b4[1].Data) != "fourth" || last4 != 3 {
		t.Errorf("after ack(1): batch %+v, last %d", b4, last4)
	}
}

func TestOutboxAck(t *testing.T) {
	o := newOutbox()
	for i := range 5 {
		o.output(uint64(i+1), "stdout", []byte(strings.Repeat("x", i+1)))
	}
	o.ack(0)
	if evs, _ := o.batch(); len(evs) != 5 {
		t.Fatalf("ack(0) removed events: %d left", len(evs))
	}
	o.ack(3)
	evs, last := o.batch()
	if len(evs) != 2 || evs[0].Seq != 4 || last != 5 {
		t.Fatalf("after ack(3): batch %+v, last %d; want seqs 4 and 5", evs, last)
	}
	if o.outSize != 4+5 {
		t.Errorf("outSize %d after ack(3), want 9", o.outSize)
	}
	o.ack(5)
	if o.pending() || o.outSize != 0 {
		t.Errorf("after ack of the last: pending %v, outSize %d", o.pending(), o.outSize)
	}
	o.ack(7) // an ack beyond the queue does no harm
	o.add(protocol.AgentEvent{Kind: protocol.KindStarted})
	if evs, last := o.batch(); len(evs) != 1 || last != 6 {
		t.Errorf("after acks: batch %+v, last %d; want seq 6", evs, last)
	}
}

func TestOutboxDropsOutputBeyondLimit(t *testing.T) {
	o := newOutbox()
	o.output(1, "stdout", bytes.Repeat([]byte("a"), maxPendingOutput-10))
	o.output(1, "stdout", []byte("0123456789")) // exactly at the limit: kept
	for len(o.wake) > 0 {
		<-o.wake
	}
	o.output(1, "stdout", []byte("dropped-1"))     // 9 bytes
	o.output(1, "stdout", make([]byte, 1000))      // 1000 bytes
	o.output(1, "stderr", []byte("dropped-err"))   // 11 bytes, another stream
	o.output(2, "stdout", []byte("dropped-other")) // 13 bytes, another process
	if outboxWoken(o) {
		t.Error("dropped output woke the sender")
	}
	o.add(protocol.AgentEvent{Kind: protocol.KindStarted, Proc: 3}) // events other than output are kept
	if o.outSize != maxPendingOutput {
		t.Fatalf("outSize %d, want %d", o.outSize, maxPendingOutput)
	}

	before := outboxAll(t, o)
	var kept int
	for _, ev := range before {
		kept += len(ev.Data)
		if bytes.Contains(ev.Data, []byte("dropped")) {
			t.Fatal("output beyond the limit was queued")
		}
	}
	if kept != maxPendingOutput || before[len(before)-1].Kind != protocol.KindStarted {
		t.Fatalf("kept %d bytes of output, then %+v; want %d bytes and the started event", kept, before[len(before)-1].Kind, maxPendingOutput)
	}

	o.output(1, "stdout", []byte("back\n"))
	o.output(2, "stdout", []byte("two\n"))
	o.output(1, "stdout", []byte("more\n"))
	evs := outboxAll(t, o)
	var got []string
	for _, ev := range evs {
		got = append(got, fmt.Sprintf("%d/%s:%s", ev.Proc, ev.Stream, ev.Data))
	}
	note := func(n int) string {
		return fmt.Sprintf("\n[elasticd agent: %d bytes of output dropped: the driver was not taking them]\n", n)
	}
	want := []string{"1/stdout:" + note(1009) + "back\n", "2/stdout:" + note(13) + "two\n", "1/stdout:more\n"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("events after the drop:\n got %q\nwant %q", got, want)
	}
	// The note is given once; stderr's comes with its next output.
	o.output(1, "stderr", []byte("err\n"))
	evs = outboxAll(t, o)
	if len(evs) != 1 || string(evs[0].Data) != note(11)+"err\n" {
		t.Errorf("stderr after the drop: %+v, want its own note of 11 bytes", evs)
	}
	o.output(1, "stdout", []byte("x"))
	if evs := outboxAll(t, o); len(evs) != 1 || string(evs[0].Data) != "x" {
		t.Errorf("output after the note: %+v, want no second note", evs)
	}
	if o.outSize != 0 {
		t.Errorf("outSize %d with nothing queued", o.outSize)
	}
}

func TestOutboxBatchBounds(t *testing.T) {
	t.Run("events", func(t *testing.T) {
		o := newOutbox()
		for range maxBatch + 44 {
			o.add(protocol.AgentEvent{Kind: protocol.KindGPU, GPU: &protocol.GPUFault{Index: -1}})
		}
		evs, last := o.batch()
		if len(evs) != maxBatch || last != maxBatch {
			t.Fatalf("batch() = %d events, last %d; want %d", len(evs), last, maxBatch)
		}
		o.ack(last)
		evs, last = o.batch()
		if len(evs) != 44 || evs[0].Seq != maxBatch+1 || last != maxBatch+44 {
			t.Errorf("second batch: %d events from %d to %d", len(evs), evs[0].Seq, last)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		o := newOutbox()
		chunk := bytes.Repeat([]byte("z"), maxChunk)
		n := maxBatchBytes/maxChunk + 8
		for i := range n {
			o.output(uint64(i+1), "stdout", chunk) // one full event per process
		}
		evs, last := o.batch()
		size := 0
		for _, ev := range evs {
			size += len(ev.Data)
		}
		if size > maxBatchBytes || len(evs) != maxBatchBytes/maxChunk || last != uint64(len(evs)) {
			t.Fatalf("batch() = %d events of %d bytes, last %d; want %d events within %d bytes", len(evs), size, last, maxBatchBytes/maxChunk, maxBatchBytes)
		}
		o.ack(last)
		if rest := outboxAll(t, o); len(rest) != 8 || rest[0].Seq != last+1 {
			t.Errorf("the rest: %d events from %d, want 8 from %d", len(rest), rest[0].Seq, last+1)
		}
	})
	t.Run("one event beyond the byte bound", func(t *testing.T) {
		// A batch always carries at least one event, or the outbox would never drain.
		o := newOutbox()
		o.output(1, "stdout", []byte("x"))
		o.events[0].ev.Data = bytes.Repeat([]byte("y"), maxBatchBytes+1)
		if evs, last := o.batch(); len(evs) != 1 || last != 1 {
			t.Errorf("batch() = %d events, last %d; want the one event", len(evs), last)
		}
	})
}
