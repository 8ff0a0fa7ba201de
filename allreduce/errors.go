package allreduce

import (
	"context"
	"errors"
	"fmt"
	"time"
)

var (
	// ErrPeerLost is wrapped by every error caused by another rank: it died, its connection
	// broke, it was silent for longer than Config.Timeout, or it aborted the operation. The
	// worker runtime answers it by restoring the last commit and resetting.
	ErrPeerLost = errors.New("peer lost")
	// ErrProtocol is wrapped when a peer sent bytes that are not a valid frame for the
	// operation in progress: garbage, a wrong generation, a wrong length, or ranks that called
	// different operations or passed buffers of different sizes.
	ErrProtocol = errors.New("protocol violation")
	// ErrPeerSilent is wrapped, with ErrPeerLost, when the peer was not lost but stopped
	// answering for longer than Config.Timeout: a hung or stopped process, which will not
	// reset by itself (the worker runtime tells the driver, which fails it at once).
	ErrPeerSilent = errors.New("peer silent")
	// ErrClosed is returned by operations on a Comm after Close.
	ErrClosed = errors.New("communicator closed")
)

// PeerError describes a lost peer. Rank is the rank held responsible; Via is the neighbour
// that delivered the news (equal to Rank when this rank saw the loss itself).
type PeerError struct {
	Rank int
	Addr string
	Via  int
	Err  error
}

func (e *PeerError) Error() string {
	s := fmt.Sprintf("peer rank %d", e.Rank)
	if e.Addr != "" {
		s += " (" + e.Addr + ")"
	}
	s += " lost"
	if e.Via != e.Rank {
		s += fmt.Sprintf(", reported by rank %d", e.Via)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap lets errors.Is match both ErrPeerLost and the underlying cause.
func (e *PeerError) Unwrap() []error { return []error{ErrPeerLost, e.Err} }

// protocolError reports a malformed frame from a direct peer.
type protocolError struct {
	rank int
	msg  string
}

func (e *protocolError) Error() string {
	return fmt.Sprintf("peer rank %d sent a malformed frame: %s", e.rank, e.msg)
}

func (e *protocolError) Unwrap() error { return ErrProtocol }

// silentError is a peer that stopped answering; it reads as the reason and matches ErrPeerSilent.
type silentError struct{ timeout time.Duration }

func (e silentError) Error() string {
	return fmt.Sprintf("silent for %v (process hung or stopped?)", e.timeout)
}

func (e silentError) Is(target error) bool { return target == ErrPeerSilent }

// formationTimeout ends New's wait when Config.Timeout passes before every neighbour has
// connected and agreed on a transport: a peer hung, stopped or never started. Like a silent
// peer in a collective, it wraps ErrPeerLost and ErrPeerSilent, so that the worker resets and
// tells the driver, which fails the member that never came, instead of exiting on it; and
// context.DeadlineExceeded, as the deadline it is.
type formationTimeout struct{ timeout time.Duration }

func (e formationTimeout) Error() string {
	return fmt.Sprintf("no answer within %v (a peer hung, stopped or never started?)", e.timeout)
}

func (e formationTimeout) Is(target error) bool {
	return target == ErrPeerLost || target == ErrPeerSilent || target == context.DeadlineExceeded
}
