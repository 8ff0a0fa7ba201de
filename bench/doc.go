// Package bench is elasticd's benchmark harness: `elasticd bench allreduce|recovery|notice|soak|report`.
// It measures elasticd on the machine it runs on, with real processes, and reports medians.
//
// What it measures (docs/benchmarks.md shows results and how to read them):
//
//   - Allreduce: a float32 sum allreduce across NP rank processes (shared memory, or TCP), per
//     message size (median of iterations, each timed by its slowest rank), as algbw and busbw,
//     beside the machine's own limits measured in the same run: single-core memcpy, one
//     loopback TCP stream and the loopback round trip.
//   - Recovery: a local job of NP workers running the demo trainer (examples/train): cold start,
//     recovery after the last-ranked worker is SIGKILLed (or SIGSTOPped), rejoin after its
//     cooldown, and the steps lost, from the trainer's timestamped step events.
//   - Notice: a 4-worker job on two agent hosts (loopback addresses) watching simulated EC2
//     metadata services: from a spot interruption notice until training goes on without the host.
//   - Soak: an agent job of several loopback hosts under random faults from a seed (workers
//     SIGKILLed and SIGSTOPped, agents killed, notices, a flapping slot, driver SIGKILL and
//     SIGTERM with restarts), then the trainer's per-sample history checked (CheckSoak): every
//     step once, no committed step lost, every sample once per epoch, bounded stalls, no
//     orphan, flat descriptors and memory.
//   - Report: medians of allreduce JSON lines from several implementations side by side
//     (bench/baselines/run.sh runs elasticd, Gloo, torch.distributed's gloo, and Open MPI over
//     TCP and over shared memory).
//
// How it is run: from the command line, `make bench` (or `elasticd bench ... --help`); in Go,
// Allreduce, Recovery, Notice, Soak and Report, each with its Options. The harness starts the
// elasticd binary (Options.Exe, this process's own binary by default) as its children: the
// allreduce ranks and the TCP peer through the hidden subcommands `elasticd bench
// allreduce-rank` (RankCommand, which runs Rank) and `elasticd bench peer` (PeerCommand,
// which runs Peer), and the jobs through `elasticd run` and `elasticd agent`. Every child is
// stopped by PID (and on Linux dies with its parent); bad options are a *UsageError.
package bench
