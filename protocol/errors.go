package protocol

import (
	"errors"
	"fmt"
	"net/http"
)

// ErrGenerationGone is wrapped by errors about a generation whose key-value data the driver
// has dropped (HTTP 410): a newer generation exists, and this worker should reset.
var ErrGenerationGone = errors.New("rendezvous: generation is over")

// StatusError is an answer other than the one a request expected.
type StatusError struct {
	Method, Target string // the request
	Code           int    // HTTP status
	Message        string // the server's one-line reason
}

func (e *StatusError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Code)
	}
	return fmt.Sprintf("%s %s: %d %s", e.Method, e.Target, e.Code, msg)
}

// Is makes a 410 match ErrGenerationGone.
func (e *StatusError) Is(target error) bool {
	return target == ErrGenerationGone && e.Code == http.StatusGone
}
