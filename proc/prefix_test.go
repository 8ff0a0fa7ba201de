package proc_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/elasticd/elasticd/proc"
)

func TestPrefixWriterLines(t *testing.T) {
	var out bytes.Buffer
	w := proc.NewPrefixWriter(&out, "[3] ")
	for _, s := range []string{"a", "b\nc\n", "", "\n", "d\ne", "f"} {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got, want := out.String(), "[3] ab\n[3] c\n[3] \n[3] d\n"; got != want {
		t.Errorf("before Close: %q, want %q", got, want)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "[3] ab\n[3] c\n[3] \n[3] d\n[3] ef\n"; got != want {
		t.Errorf("after Close: %q, want %q", got, want)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := w.Write([]byte("x\n")); err == nil {
		t.Error("Write after Close succeeded")
	}
}

func TestPrefixWriterFlush(t *testing.T) {
	var out bytes.Buffer
	w := proc.NewPrefixWriter(&out, "> ")
	w.Write([]byte("partial"))
	w.Flush()
	w.Flush() // nothing more to write
	w.Write([]byte("next\n"))
	if got, want := out.String(), "> partial\n> next\n"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

// A line that never ends is cut into lines of 64 KiB rather than held without bound.
func TestPrefixWriterLongLine(t *testing.T) {
	var out bytes.Buffer
	w := proc.NewPrefixWriter(&out, "> ")
	chunk := strings.Repeat("x", 1000)
	for range 200 {
		w.Write([]byte(chunk))
	}
	w.Close()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	total := 0
	for _, l := range lines {
		if !strings.HasPrefix(l, "> ") || len(l)-2 > 65*1024 {
			t.Fatalf("line of %d bytes starting %q", len(l), l[:min(len(l), 10)])
		}
		total += len(l) - 2
	}
	if total != 200*1000 || len(lines) < 3 {
		t.Errorf("%d bytes in %d lines, want 200000 in several", total, len(lines))
	}
}

// The prefix is asked for at each line, so a rank that changes shows in the next line.
func TestPrefixWriterFunc(t *testing.T) {
	var out bytes.Buffer
	rank := 1
	w := proc.NewPrefixWriterFunc(&out, func() string { return fmt.Sprintf("[%d] ", rank) })
	w.Write([]byte("a\nb"))
	rank = 2
	w.Write([]byte("\nc\n"))
	if got, want := out.String(), "[1] a\n[2] b\n[2] c\n"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

// PrefixWriters sharing one LockedWriter, written from many goroutines, never interleave
// inside a line, and the writer under it (not safe for concurrent use) is never written
// concurrently.
func TestPrefixWriterShared(t *testing.T) {
	var out bytes.Buffer
	shared := proc.NewLockedWriter(&out)
	var wg sync.WaitGroup
	const writers, lines = 8, 500
	for i := range writers {
		w := proc.NewPrefixWriter(shared, fmt.Sprintf("[%d] ", i))
		wg.Go(func() {
			for j := range lines {
				// A line in three writes, so that unserialised output would show.
				fmt.Fprintf(w, "line ")
				fmt.Fprintf(w, "%d of", j)
				fmt.Fprintf(w, " writer %d\n", i)
			}
		})
	}
	wg.Wait()
	got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(got) != writers*lines {
		t.Fatalf("%d lines, want %d", len(got), writers*lines)
	}
	for _, l := range got {
		var i, j, k int
		if _, err := fmt.Sscanf(l, "[%d] line %d of writer %d", &i, &j, &k); err != nil || i != k {
			t.Fatalf("mangled line %q", l)
		}
	}
}
