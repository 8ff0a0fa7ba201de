// Package allreduce is the collective-communication library that elastic workers use to
// average gradients and share state: Allreduce, Broadcast, Allgather and Barrier over TCP, and
// over shared memory between ranks on one machine.
//
// A Comm serves one generation of one job. Every rank listens, publishes its address and host
// in a rendezvous Store under a generation-scoped key, and connects to the few peers its
// algorithms need (ring neighbours and recursive-doubling partners; across hosts also its
// host's ranks and ring partners on other hosts). Large messages take a chunked, pipelined
// ring (reduce-scatter then allgather) in which sending, receiving and reducing overlap
// (recursive halving and doubling instead, where n is a power of two of at least 4); small
// ones take recursive doubling, log2(n) exchanges instead of 2(n-1) ring steps. A world of
// several hosts with several ranks on some reduces large messages hierarchically: inside each
// host over shared memory, across hosts one ring per slice of the buffer, then back to every
// rank of the host. Every element is reduced in an order fixed before any data moves, the
// same for every rank, so all ranks end bit-identical.
//
// Ranks on the same Linux machine move their data through shared memory (a memfd both map,
// one lock-free ring per direction, futex waits) and keep their TCP connection for setup,
// aborts and liveness; Config.Transport = TransportTCP keeps them on TCP.
//
// Failure is part of the contract: a dead peer, a broken connection, a peer silent for longer
// than Config.Timeout, a malformed frame or a cancelled context makes the operation fail on
// every rank, within a bounded time, with an error that names the peer (see ErrPeerLost). A
// Comm that has failed stays failed; elastic training builds a new one for the next generation.
package allreduce
