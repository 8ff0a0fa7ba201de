package agents

import (
	"net/http"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// An agent checking its setup (`elasticd agent --check`): a signed GET
// protocol.AgentPathCheck, which changes nothing (no session, no host offered to the job; only
// its nonce is remembered, as every request's is). The signed answer proves both sides hold the
// same secret, and carries the driver's version and clock.
func (r *Registry) check(a protocol.Answer, req *http.Request, now time.Time) {
	r.log.Info("an agent checked its setup: its secret is the driver's", "host", req.URL.Query().Get("host"), "remote", req.RemoteAddr)
	a.JSON(protocol.AgentCheckAnswer{Protocol: protocol.AgentProtocolVersion, Version: r.cfg.Version, JobID: r.cfg.JobID, Time: now.UTC()})
}
