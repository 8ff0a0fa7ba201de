package allreduce

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Store is the rendezvous key-value store through which ranks find each other. Get waits
// until the key is set or ctx ends. Keys written by this package always carry the
// generation, so a reset never reads an address left over from an earlier generation.
type Store interface {
	Set(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
}

// MemStore is a Store for ranks that share one process (tests, benchmarks).
type MemStore struct {
	mu      sync.Mutex
	m       map[string][]byte
	changed chan struct{} // closed and replaced on every Set
}

// NewMemStore returns an empty in-memory store.
func NewMemStore() *MemStore {
	return &MemStore{m: map[string][]byte{}, changed: make(chan struct{})}
}

// Set stores a copy of value under key.
func (s *MemStore) Set(_ context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = append([]byte(nil), value...)
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

// Get waits until key is set, then returns a copy of its value.
func (s *MemStore) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		s.mu.Lock()
		v, ok := s.m[key]
		changed := s.changed
		s.mu.Unlock()
		if ok {
			return append([]byte(nil), v...), nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for key %q: %w", key, ctx.Err())
		}
	}
}

// FileStore is a Store in a directory shared by processes on one machine (one file per
// key, written atomically by rename). It serves local benchmarks and multi-process tests.
type FileStore struct {
	Dir string
	// Poll is how often Get looks for a missing key; 0 means 2ms.
	Poll time.Duration
}

func (s *FileStore) path(key string) string {
	return filepath.Join(s.Dir, url.PathEscape(key))
}

// Set writes value under key.
func (s *FileStore) Set(_ context.Context, key string, value []byte) error {
	tmp, err := os.CreateTemp(s.Dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("file store set %q: %w", key, err)
	}
	_, werr := tmp.Write(value)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("file store set %q: %w", key, err)
	}
	if err := os.Rename(tmp.Name(), s.path(key)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("file store set %q: %w", key, err)
	}
	return nil
}

// Get waits until key exists, polling the directory.
func (s *FileStore) Get(ctx context.Context, key string) ([]byte, error) {
	poll := s.Poll
	if poll <= 0 {
		poll = 2 * time.Millisecond
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for key %q: %w", key, ctx.Err())
		case <-t.C:
		}
		v, err := os.ReadFile(s.path(key))
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("file store get %q: %w", key, err)
		}
		t.Reset(poll)
	}
}
