// Package rendezvous is the driver's HTTP rendezvous service and the worker's client for it:
// worker reports, generation assignments, host-update notices and a generation-scoped
// key-value store, every request authenticated with an HMAC of a per-job secret.
//
// The wire protocol is described in docs/protocol.md §2. In short: the driver owns a
// Server (an http.Handler) and calls Publish when it starts a generation; workers long-poll
// for their Assignment, report READY/SUCCESS/FAILURE, and bootstrap their collectives through
// Client.Store, whose keys vanish (410 Gone) once a newer generation is published, so a reset
// can never read an address left over from the previous world.
//
// The Server does no I/O of its own beyond answering requests: the caller runs it under an
// http.Server. Long-polls hold a request for at most ServerConfig.PollTimeout, so the
// http.Server must not set a WriteTimeout shorter than that; a ReadHeaderTimeout and an
// IdleTimeout are recommended.
package rendezvous
