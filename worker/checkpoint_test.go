package worker

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
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

// A commit at which the ranks agree on a host change (a notice, a scale-in, the job stopping
// for its budget) is written to the checkpoint directory, whatever CheckpointEvery: a job
// that ends there resumes from it.
func TestCheckpointAtAPlannedChange(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { srv.Close(); hs.Close() })
	ids := []protocol.WorkerID{{Host: "h0"}, {Host: "h1"}}
	plan := map[protocol.WorkerID]protocol.Assignment{}
	for r, w := range ids {
		plan[w] = protocol.Assignment{Generation: 1, Rank: r, Size: 2, LocalRank: r, LocalSize: 2}
	}
	srv.Publish(1, plan)
	dir := t.TempDir()
	commits := make([]int, 2)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			w, err := New(ctx, Config{Rendezvous: hs.URL, Secret: secret, ID: ids[i], Generation: 1, HostAddr: "127.0.0.1",
				CommTimeout: 10 * time.Second, CheckpointDir: dir, CheckpointEvery: 1_000_000}, nil)
			if err != nil {
				errs[i] = err
				return
			}
			defer w.Close(context.Background(), nil)
			st := NewState(w)
			for c := 1; c <= 100000; c++ {
				if c == 7 && i == 0 {
					srv.NotifyHostsUpdated()
				}
				err := st.Commit(ctx)
				if errors.Is(err, ErrHostsUpdated) {
					commits[i] = c
					return
				}
				if err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
	c := newestCheckpoint(dir, func(path string, err error) { t.Errorf("%s: %v", path, err) })
	if c == nil || c.version != uint64(commits[0]) {
		t.Fatalf("newest checkpoint %+v; want the commit of the host change, %d (CheckpointEvery is a million)", c, commits[0])
	}
	if n := len(ckptFiles(dir)); n != 1 {
		t.Fatalf("%d checkpoint files %v, want the one of the host change (commits %v)", n, ckptFiles(dir), commits)
	}
}
