// The key-value store of each generation, where workers bootstrap their collectives.

package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/protocol"
)

// genKV is one generation's key-value store.
type genKV struct {
	vals    map[string][]byte
	waiting map[string]chan struct{} // keys someone waits for; closed when set or dropped
}

func (s *Server) handleKVPut(w http.ResponseWriter, r *http.Request) {
	gen, key, ok := kvParams(w, r)
	if !ok {
		return
	}
	value, _ := io.ReadAll(r.Body) // already in memory, and bounded
	if status, msg := s.set(gen, key, value); status != 0 {
		http.Error(w, msg, status)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// set stores a key of generation gen; a non-zero status says why it could not.
func (s *Server) set(gen uint64, key string, value []byte) (int, string) {
	s.mu.Lock()
	g, status, msg := s.kvGenLocked(gen)
	if g != nil {
		_, set := g.vals[key]
		_, waited := g.waiting[key]
		if !set && !waited && len(g.vals)+len(g.waiting) >= s.cfg.MaxKeys {
			g, status, msg = nil, http.StatusInsufficientStorage, fmt.Sprintf("generation %d already holds %d keys, the limit", gen, s.cfg.MaxKeys)
		}
	}
	if g != nil {
		g.vals[key] = value
		if ch, ok := g.waiting[key]; ok {
			close(ch)
			delete(g.waiting, key)
		}
	}
	s.mu.Unlock()
	if g == nil {
		return status, msg
	}
	s.log.Debug("key set", "generation", gen, "key", key, "bytes", len(value))
	return 0, ""
}

// Store is the driver's own view of generation gen's key-value store, the same data
// workers reach over HTTP (the driver uses it to abandon a generation at a reset).
func (s *Server) Store(gen uint64) allreduce.Store { return serverStore{s, gen} }

type serverStore struct {
	s   *Server
	gen uint64
}

func (st serverStore) Set(_ context.Context, key string, value []byte) error {
	if status, msg := st.s.set(st.gen, key, bytes.Clone(value)); status != 0 {
		return &protocol.StatusError{Code: status, Message: msg}
	}
	return nil
}

func (st serverStore) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		st.s.mu.Lock()
		g, status, msg := st.s.kvGenLocked(st.gen)
		if g == nil {
			st.s.mu.Unlock()
			return nil, &protocol.StatusError{Code: status, Message: msg}
		}
		if v, ok := g.vals[key]; ok {
			st.s.mu.Unlock()
			return bytes.Clone(v), nil
		}
		ch, ok := g.waiting[key]
		if !ok {
			ch = make(chan struct{})
			g.waiting[key] = ch
		}
		st.s.mu.Unlock()
		select {
		case <-ch: // set, or the generation dropped: look again
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *Server) handleKVGet(w http.ResponseWriter, r *http.Request) {
	gen, key, ok := kvParams(w, r)
	if !ok {
		return
	}
	s.longPoll(w, r, &s.kvPolls, func() (func(), <-chan struct{}) {
		g, status, msg := s.kvGenLocked(gen)
		if g == nil {
			return func() { http.Error(w, msg, status) }, nil
		}
		if value, found := g.vals[key]; found {
			return func() {
				w.Header().Set("Content-Type", "application/octet-stream")
				w.Header().Set("Content-Length", strconv.Itoa(len(value)))
				w.Write(value) // values are never modified in place: a Set stores a new slice
			}, nil
		}
		ch := g.waiting[key]
		if ch == nil {
			if len(g.vals)+len(g.waiting) >= s.cfg.MaxKeys {
				return func() {
					http.Error(w, fmt.Sprintf("generation %d already holds %d keys, the limit", gen, s.cfg.MaxKeys), http.StatusInsufficientStorage)
				}, nil
			}
			ch = make(chan struct{})
			g.waiting[key] = ch
		}
		return nil, ch
	})
}

// kvGenLocked returns generation gen's store, creating it, or the status that refuses it.
func (s *Server) kvGenLocked(gen uint64) (*genKV, int, string) {
	switch {
	case gen < s.kvFloor:
		return nil, http.StatusGone, fmt.Sprintf("generation %d is over (current %d): its keys are gone", gen, s.gen)
	case gen > s.gen:
		return nil, http.StatusConflict, fmt.Sprintf("generation %d is not published yet (current %d)", gen, s.gen)
	}
	g := s.kv[gen]
	if g == nil {
		g = &genKV{vals: map[string][]byte{}, waiting: map[string]chan struct{}{}}
		s.kv[gen] = g
	}
	return g, 0, ""
}

func kvParams(w http.ResponseWriter, r *http.Request) (uint64, string, bool) {
	gs := r.PathValue("gen")
	gen, err := parseUint(gs)
	if err != nil {
		http.Error(w, fmt.Sprintf("bad generation %q: want a non-negative decimal", gs), http.StatusBadRequest)
		return 0, "", false
	}
	key := r.PathValue("key")
	if err := validKey(key); err != nil {
		http.Error(w, fmt.Sprintf("bad key %q: %v", key, err), http.StatusBadRequest)
		return 0, "", false
	}
	return gen, key, true
}

func validKey(key string) error {
	switch {
	case key == "":
		return errors.New("empty")
	case len(key) > maxKeyLen:
		return fmt.Errorf("longer than %d bytes", maxKeyLen)
	case !utf8.ValidString(key):
		return errors.New("not valid UTF-8")
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return errors.New("contains a control character")
	}
	return nil
}
