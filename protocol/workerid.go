package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// WorkerID is a worker's stable identity for the life of a job: host ID and slot. Its text
// form is "<host>/<slot>", split at the last '/': the host is non-empty and may itself contain
// ':', '.', '[', ']' (and '/'); the slot is a non-negative decimal.
type WorkerID struct {
	Host string
	Slot int
}

const (
	maxHostLen = 255
	maxSlot    = 1<<31 - 1
)

// String returns the text form "<host>/<slot>".
func (w WorkerID) String() string { return w.Host + "/" + strconv.Itoa(w.Slot) }

// Compare orders w and o as their text forms compare (strings.Compare(w.String(),
// o.String())) without building them: sorting a large job's workers by ID allocates nothing.
func (w WorkerID) Compare(o WorkerID) int {
	n := min(len(w.Host), len(o.Host))
	if c := strings.Compare(w.Host[:n], o.Host[:n]); c != 0 {
		return c
	}
	// Past the common part, what is left of each text form: the rest of its host (one of the
	// two rests is empty), '/' and the slot.
	var wb, ob [maxHostLen + 24]byte
	wr := strconv.AppendInt(append(append(wb[:0], w.Host[n:]...), '/'), int64(w.Slot), 10)
	or := strconv.AppendInt(append(append(ob[:0], o.Host[n:]...), '/'), int64(o.Slot), 10)
	return bytes.Compare(wr, or)
}

// ParseWorkerID parses the text form "<host>/<slot>".
func ParseWorkerID(s string) (WorkerID, error) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return WorkerID{}, fmt.Errorf("worker ID %q: want <host>/<slot>", s)
	}
	host, slot := s[:i], s[i+1:]
	if err := validHost(host); err != nil {
		return WorkerID{}, fmt.Errorf("worker ID %q: %w", s, err)
	}
	n, err := parseSlot(slot)
	if err != nil {
		return WorkerID{}, fmt.Errorf("worker ID %q: %w", s, err)
	}
	return WorkerID{Host: host, Slot: n}, nil
}

func validHost(host string) error {
	switch {
	case host == "":
		return errors.New("empty host")
	case len(host) > maxHostLen:
		return fmt.Errorf("host longer than %d bytes", maxHostLen)
	case !utf8.ValidString(host):
		return errors.New("host is not valid UTF-8")
	case strings.IndexFunc(host, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return errors.New("host contains a space or control character")
	}
	return nil
}

func parseSlot(slot string) (int, error) {
	if slot == "" {
		return 0, errors.New("empty slot")
	}
	for i := 0; i < len(slot); i++ {
		if slot[i] < '0' || slot[i] > '9' {
			return 0, fmt.Errorf("slot %q is not a non-negative decimal", slot)
		}
	}
	n, err := strconv.Atoi(slot)
	if err != nil || n > maxSlot {
		return 0, fmt.Errorf("slot %q is out of range", slot)
	}
	return n, nil
}

// MarshalText returns the text form, so a WorkerID can be a JSON string or map key.
func (w WorkerID) MarshalText() ([]byte, error) {
	if err := validHost(w.Host); err != nil {
		return nil, fmt.Errorf("worker ID %q: %w", w.String(), err)
	}
	if w.Slot < 0 || w.Slot > maxSlot {
		return nil, fmt.Errorf("worker ID %q: slot out of range", w.String())
	}
	return []byte(w.String()), nil
}

// UnmarshalText parses the text form.
func (w *WorkerID) UnmarshalText(b []byte) error {
	id, err := ParseWorkerID(string(b))
	if err != nil {
		return err
	}
	*w = id
	return nil
}
