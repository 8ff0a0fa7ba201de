// Package protocol is the one definition of how elasticd's processes talk to each other
// (docs/protocol.md): what the driver and its workers say in rendezvous (§2), the environment
// the driver gives every worker (§3), and what the driver and the per-host agents say (§4) —
// the wire types, worker IDs, the request and answer signing shared by all of them, nonces,
// ProtocolVersion and the protocol's errors.
//
// Both sides import it and it imports neither: the driver's server (driver/rendezvous,
// driver/agents) and the Go clients (worker/rendezvous, worker/agent). The Python package
// (python/elasticd) speaks the same protocol; docs/protocol.md is where the two meet.
package protocol
