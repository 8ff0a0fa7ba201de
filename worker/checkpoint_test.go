package worker

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Checkpoints are written whole or not at all, the newest valid one is read back, and a torn
// or corrupt newer one is skipped with the reason, never loaded; only the newest two stay.
func TestCheckpointFiles(t *testing.T) {
	dir := t.TempDir()
	for i, total := range []uint64{10, 20, 30} {
		if err := writeCheckpoint(dir, uint64(i+1), total, bytes.Repeat([]byte{byte(i + 1)}, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	if names := ckptFiles(dir); len(names) != 2 || !strings.Contains(names[0], "00000000000000000030") {
		t.Fatalf("files %v: want the newest two, newest first", names)
	}
	var skipped []string
	skip := func(path string, err error) { skipped = append(skipped, filepath.Base(path)+": "+err.Error()) }
	if c := newestCheckpoint(dir, skip); c == nil || c.total != 30 || c.version != 3 || c.payload[0] != 3 || len(skipped) != 0 {
		t.Fatalf("newest %+v, skipped %v", c, skipped)
	}
	newest := filepath.Join(dir, ckptFiles(dir)[0])
	b, _ := os.ReadFile(newest)
	b[len(b)-1] ^= 0xff // a flipped bit in the state
	os.WriteFile(newest, b, 0o644)
	if c := newestCheckpoint(dir, skip); c == nil || c.total != 20 || len(skipped) != 1 || !strings.Contains(skipped[0], "corrupt") {
		t.Fatalf("after corrupting the newest: %+v, skipped %v; want step 20 and the newest skipped as corrupt", c, skipped)
	}
	os.WriteFile(newest, b[:len(b)/2], 0o644) // torn: a crash in the middle of a copy
	skipped = nil
	if c := newestCheckpoint(dir, skip); c == nil || c.total != 20 || len(skipped) != 1 || !strings.Contains(skipped[0], "torn") {
		t.Fatalf("after tearing the newest: %+v, skipped %v", c, skipped)
	}
	os.WriteFile(filepath.Join(dir, ckptName(40, 4)), []byte("garbage"), 0o644)
	skipped = nil
	if c := newestCheckpoint(dir, skip); c == nil || c.total != 20 || len(skipped) != 2 {
		t.Fatalf("with garbage as the newest: %+v, skipped %v", c, skipped)
	}
	if c := newestCheckpoint(t.TempDir(), skip); c != nil {
		t.Fatalf("an empty directory gave %+v", c)
	}
}
