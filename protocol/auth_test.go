package protocol_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// A server refuses a request signed before it started, saying why: a restarted driver has
// none of its predecessor's nonces, and a request captured on the way to that one would
// otherwise be taken again within the replay window. One signed since is taken.
func TestAuthRefusesRequestsSignedBeforeItStarted(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	client := protocol.NewSigner(secret, protocol.AgentAuthLabel)
	captured := httptest.NewRequest(http.MethodPost, "/v1/agents/register", nil)
	client.Sign(captured, nil)

	server, err := protocol.NewAuth(secret, protocol.AgentAuthLabel, 0)
	if err != nil {
		t.Fatal(err)
	}
	server.StartedAt(time.Now().Add(2 * time.Second)) // it restarted after the capture
	_, err = server.Verify(captured, nil, time.Now())
	if err == nil || !protocol.SignedBeforeStart(err.Error()) {
		t.Fatalf("a request signed before the server started: %v, want %q", err, protocol.ReasonSignedBeforeStart)
	}

	server.StartedAt(time.Now().Add(-time.Second))
	fresh := httptest.NewRequest(http.MethodPost, "/v1/agents/register", nil)
	client.Sign(fresh, nil)
	if _, err := server.Verify(fresh, nil, time.Now()); err != nil {
		t.Fatalf("a request signed after the server started: %v", err)
	}
}
