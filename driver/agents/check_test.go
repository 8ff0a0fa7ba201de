package agents_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/agents"
	"github.com/elasticd/elasticd/protocol"
)

// An agent that checks its setup gets a signed answer with the driver's version, job and clock,
// and leaves nothing behind: no session, no host for the job. A wrong secret is refused,
// unsigned, and the refusal still says that the agents' protocol answered.
func TestCheckEndpoint(t *testing.T) {
	e := newEnv(t, func(c *agents.Config) { c.Version = "v9.9.9" })
	before := time.Now()
	var ans protocol.AgentCheckAnswer
	r := e.client(t, secret).call(t, http.MethodGet, protocol.AgentPathCheck+"?host=gpu-1", nil, http.StatusOK, &ans)
	if ans.Protocol != protocol.AgentProtocolVersion || ans.Version != "v9.9.9" || ans.JobID != jobID {
		t.Errorf("answer %+v: want protocol %d, version v9.9.9, job %s", ans, protocol.AgentProtocolVersion, jobID)
	}
	if ans.Time.Before(before.Add(-time.Second)) || ans.Time.After(time.Now().Add(time.Second)) {
		t.Errorf("answer's time %v is not the driver's clock (now %v)", ans.Time, time.Now())
	}
	if got := r.header.Get(protocol.HeaderAgentsProtocol); got != strconv.Itoa(protocol.AgentProtocolVersion) {
		t.Errorf("%s: %q", protocol.HeaderAgentsProtocol, got)
	}
	if a := e.reg.Agents(); len(a) != 0 {
		t.Errorf("a check registered agents: %+v", a)
	}
	if u := e.reg.Unconnected(0, time.Now()); len(u) != 0 {
		t.Errorf("a check left hosts: %+v", u)
	}

	// A wrong secret: 401, unsigned, with the protocol's header.
	wrong := e.client(t, []byte("another-secret-of-enough-bytes"))
	r, err := wrong.send(http.MethodGet, protocol.AgentPathCheck, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusUnauthorized || r.header.Get(protocol.HeaderAnswerSignature) != "" {
		t.Errorf("wrong secret: answer %v, signed %q; want an unsigned 401", r, r.header.Get(protocol.HeaderAnswerSignature))
	}
	if got := r.header.Get(protocol.HeaderAgentsProtocol); got != strconv.Itoa(protocol.AgentProtocolVersion) {
		t.Errorf("the refusal's %s: %q, want the protocol version", protocol.HeaderAgentsProtocol, got)
	}
	if !strings.Contains(oneLine(t, r), "bad signature") {
		t.Errorf("wrong secret: %v", r)
	}

	// Only GET: another method is no check.
	e.client(t, secret).call(t, http.MethodPost, protocol.AgentPathCheck, []byte("{}"), http.StatusNotFound, nil)
	if a := e.reg.Agents(); len(a) != 0 {
		t.Errorf("agents after the checks: %+v", a)
	}
}
