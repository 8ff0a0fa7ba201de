package worker

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/elasticd/elasticd/internal/atomicfile"
)

// Checkpoints: rank 0's commit on disk (Config.CheckpointDir), so that a job whose workers
// were all lost at once resumes from it instead of from step 0. A file is
//
//	magic "ELASTICD-CKPT\x01" | version u64 | total u64 | length u64 | sha256(payload) | payload
//
// (little-endian; payload = State.blob()), written to a temporary name, synced and renamed,
// so a reader sees a whole file or none; a torn or corrupt file fails its length or digest
// and is skipped, never loaded. The newest two are kept.

var ckptMagic = []byte("ELASTICD-CKPT\x01")

const (
	ckptPrefix = "state-"
	ckptSuffix = ".ckpt"
	ckptKeep   = 2
)

// checkpoint is one file's content.
type checkpoint struct {
	path           string
	version, total uint64
	payload        []byte
}

func ckptName(total, version uint64) string {
	return fmt.Sprintf("%s%020d-%020d%s", ckptPrefix, total, version, ckptSuffix)
}

// writeCheckpoint writes payload as the checkpoint of commit version at step total, then
// removes all but the newest ckptKeep.
func writeCheckpoint(dir string, version, total uint64, payload []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	var b bytes.Buffer
	b.Write(ckptMagic)
	for _, v := range []uint64{version, total, uint64(len(payload))} {
		b.Write(binary.LittleEndian.AppendUint64(nil, v))
	}
	sum := sha256.Sum256(payload)
	b.Write(sum[:])
	b.Write(payload)
	final := filepath.Join(dir, ckptName(total, version))
	if err := atomicfile.WriteFile(final, b.Bytes(), 0o644, ckptPrefix); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	names := ckptFiles(dir)
	for _, n := range names[min(len(names), ckptKeep):] {
		os.Remove(filepath.Join(dir, n))
	}
	return nil
}

// ckptFiles lists the checkpoint files in dir, newest first.
func ckptFiles(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		if n := e.Name(); strings.HasPrefix(n, ckptPrefix) && strings.HasSuffix(n, ckptSuffix) && e.Type().IsRegular() {
			names = append(names, n)
		}
	}
	slices.Sort(names) // zero-padded step, then version: lexical order is age
	slices.Reverse(names)
	return names
}

// readCheckpoint reads and verifies one file.
func readCheckpoint(path string) (*checkpoint, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	head := len(ckptMagic) + 24 + sha256.Size
	if len(b) < head || !bytes.Equal(b[:len(ckptMagic)], ckptMagic) {
		return nil, errors.New("not an elasticd checkpoint, or cut short")
	}
	p := b[len(ckptMagic):]
	c := &checkpoint{path: path, version: binary.LittleEndian.Uint64(p), total: binary.LittleEndian.Uint64(p[8:])}
	n := binary.LittleEndian.Uint64(p[16:])
	sum := p[24 : 24+sha256.Size]
	payload := b[head:]
	if uint64(len(payload)) != n {
		return nil, fmt.Errorf("torn: %d bytes of state where the header says %d", len(payload), n)
	}
	if got := sha256.Sum256(payload); !bytes.Equal(got[:], sum) {
		return nil, errors.New("corrupt: the state does not match its digest")
	}
	c.payload = payload
	return c, nil
}

// newestCheckpoint is the newest valid checkpoint in dir, or nil; skipped files are reported
// to skip.
func newestCheckpoint(dir string, skip func(path string, err error)) *checkpoint {
	for _, n := range ckptFiles(dir) {
		c, err := readCheckpoint(filepath.Join(dir, n))
		if err == nil {
			return c
		}
		skip(filepath.Join(dir, n), err)
	}
	return nil
}
