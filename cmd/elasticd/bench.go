package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/elasticd/elasticd/bench"
	"github.com/urfave/cli/v2"
)

// The bench commands parse their flags into the options of package bench, which runs the
// benchmarks; a *bench.UsageError exits 2 like every other bad input.

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure collectives and the machine they run on",
		Subcommands: []*cli.Command{
			benchAllreduceCommand(),
			benchRecoveryCommand(),
			benchNoticeCommand(),
			benchSoakCommand(),
			benchScaleCommand(),
			benchReportCommand(),
			benchRankCommand(),
			benchPeerCommand(),
		},
	}
}

func benchAllreduceCommand() *cli.Command {
	return &cli.Command{
		Name:  "allreduce",
		Usage: "time float32 sum allreduce across N local processes (shared memory, or TCP)",
		Description: `Starts --np rank processes on this machine and times a float32 sum Allreduce of
each size (median of --iters iterations; each iteration's time is the slowest rank's).
Ranks on one machine exchange data through shared memory, as elasticd's workers on one
host do (--transport tcp: over loopback TCP instead, as they would across hosts); copies
into shared memory use non-temporal stores as the machine's caches suggest
(ELASTICD_SHM_NONTEMPORAL=auto, 1 or 0; JSON: non_temporal), and 2 to 4 ranks
reduce large messages by reading each other's buffers where the machine's
kernel copies fast enough (--direct-bytes; JSON: direct). In the same run it
measures the machine's own limits: single-core memcpy bandwidth, one loopback TCP
stream between two processes, and the loopback round trip, and reports the
allreduce as fractions of them, so results compare across machines.

   algbw = size / median time
   busbw = algbw * 2(n-1)/n     (bytes each rank moves in a ring; compare with links)

Sizes take B, KB, MB, GB (powers of 1024) and must be multiples of 4 bytes.
Example: elasticd bench allreduce --np 4 --sizes 4KB,64MB,256MB --json

Across hosts: --netns-hosts puts the ranks in network namespaces that you have
created and joined (bench/baselines/run.sh does it with HOSTS=2), each namespace a
host: ranks of one namespace share memory, ranks of different ones talk TCP to the
address given for theirs. The JSON then carries hosts, per_host, and every rank's
shm and TCP peer counts (rank_shm_peers, rank_tcp_peers); the machine baseline is
not measured.
Example: elasticd bench allreduce --np 4 --netns-hosts h1=10.99.0.1,h2=10.99.0.2 --json`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "np", Value: 2, Usage: "number of rank processes (1-64)", EnvVars: []string{"ELASTICD_NP"}},
			&cli.StringFlag{Name: "sizes", Value: "4KB,64KB,1MB,16MB,64MB", Usage: "comma-separated message sizes", EnvVars: []string{"ELASTICD_SIZES"}},
			&cli.IntFlag{Name: "iters", Usage: "timed iterations per size (0: about 1 GB of traffic per size, 5 to 500)", EnvVars: []string{"ELASTICD_ITERS"}},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per size instead of a table", EnvVars: []string{"ELASTICD_JSON"}},
			&cli.BoolFlag{Name: "no-baseline", Usage: "skip measuring memcpy, loopback TCP and round trip", EnvVars: []string{"ELASTICD_NO_BASELINE"}},
			&cli.IntFlag{Name: "chunk-bytes", Usage: "ring pipelining chunk (0: library default)", EnvVars: []string{"ELASTICD_CHUNK_BYTES"}},
			&cli.IntFlag{Name: "small-bytes", Usage: "largest message sent by recursive doubling (0: library default)", EnvVars: []string{"ELASTICD_SMALL_BYTES"}},
			&cli.IntFlag{Name: "direct-bytes", Usage: "smallest message that ranks on one machine (2 to 4 of them) reduce by reading each other's buffers, one copy by the kernel (process_vm_readv), instead of two through the shared-memory rings: 0 as the machine suggests (ELASTICD_SHM_DIRECT=auto, 1 or 0), -1 never, or a size in bytes (JSON: direct)", EnvVars: []string{"ELASTICD_DIRECT_BYTES"}},
			&cli.StringFlag{Name: "transport", Value: "auto", Usage: "ranks on this machine talk over shared memory (auto) or TCP (tcp)", EnvVars: []string{"ELASTICD_TRANSPORT"}},
			&cli.IntFlag{Name: "tcp-send-buffer", Usage: "send buffer (SO_SNDBUF) of the ranks' TCP connections in bytes: 0 the default (256 KiB where a connection runs over veth under BBR congestion control, the kernel's autotuning elsewhere), -1 the kernel's autotuning everywhere", EnvVars: []string{"ELASTICD_TCP_SEND_BUFFER"}},
			&cli.DurationFlag{Name: "timeout", Value: time.Minute, Usage: "how long a rank waits on a silent peer", EnvVars: []string{"ELASTICD_TIMEOUT"}},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write each rank's CPU profile to `DIR`/rank-N.pprof (for go tool pprof)", EnvVars: []string{"ELASTICD_CPUPROFILE"}},
			&cli.StringFlag{Name: "netns-hosts", Usage: "simulate hosts: `NS=IP,...` network namespaces (ip netns add) with an address each; --np/hosts ranks run in each, in rank order, over TCP between them (default: none, all ranks here); needs root and ip. Example: h1=10.99.0.1,h2=10.99.0.2", EnvVars: []string{"ELASTICD_NETNS_HOSTS"}},
		},
		Action: benchAllreduce,
	}
}

func benchAllreduce(c *cli.Context) error {
	hosts, err := bench.ParseNetnsHosts(c.String("netns-hosts"))
	if err != nil {
		return usageError("netns-hosts", "%v", err)
	}
	o := bench.AllreduceOptions{NP: c.Int("np"), Hosts: hosts, Iters: c.Int("iters"), ChunkBytes: c.Int("chunk-bytes"), SmallBytes: c.Int("small-bytes"),
		TCPSendBuffer: c.Int("tcp-send-buffer"), DirectBytes: c.Int("direct-bytes"), Transport: c.String("transport"), Timeout: c.Duration("timeout"), ProfileDir: c.String("cpuprofile"), NoBaseline: c.Bool("no-baseline"), JSON: c.Bool("json"),
		Out: c.App.Writer, Err: c.App.ErrWriter}
	if err := o.Validate(); err != nil {
		return benchExit(err)
	}
	if err := o.MakeProfileDir(); err != nil {
		return benchExit(err)
	}
	if o.Sizes, err = bench.ParseSizes(c.String("sizes")); err != nil {
		return usageError("sizes", "%v", err)
	}
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("bench allreduce takes no arguments, got %q (sizes go in --sizes)", c.Args().First()), 2)
	}
	_, err = bench.Allreduce(c.Context, o)
	return benchExit(err)
}

func benchRecoveryCommand() *cli.Command {
	return &cli.Command{
		Name:  "recovery",
		Usage: "time cold start, recovery from a SIGKILLed worker, and rejoin, with the demo trainer",
		Description: `Runs 'elasticd run -np N' on this machine with the demo trainer (examples/train) --runs
times. In each run it waits for training, SIGKILLs the last-ranked worker by PID, and
measures, from the trainer's own timestamped step events:

   cold_start  elasticd run started           -> first step done
   recovery    the SIGKILL                    -> first step done by the N-1 survivors
   join        the dead slot listed again     -> first step done by N workers again
               (after its 1 s cooldown)
   steps_lost  last step done before the kill - the step the survivors resumed at

and prints the medians over the runs.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "np", Value: 4, Usage: "workers (2-32)", EnvVars: []string{"ELASTICD_NP"}},
			&cli.IntFlag{Name: "runs", Value: 5, Usage: "jobs to run; medians are over them", EnvVars: []string{"ELASTICD_RUNS"}},
			&cli.StringFlag{Name: "program", Value: bench.ProgramGo, Usage: "what the job trains: go (the demo trainer, worker.State) or torch (bench/pytorch/soak_train.py: elasticd.torch in-process, gloo; built into this binary)", EnvVars: []string{"ELASTICD_PROGRAM"}},
			&cli.StringFlag{Name: "trainer", Usage: "with --program go: the demo trainer binary (default: train beside elasticd, as make build puts it)", EnvVars: []string{"ELASTICD_TRAINER"}},
			&cli.StringFlag{Name: "python", Usage: "with --program torch: an interpreter that imports torch (default: /usr/bin/python3, then python3)", EnvVars: []string{"ELASTICD_PYTHON"}},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object", EnvVars: []string{"ELASTICD_JSON"}},
			&cli.StringFlag{Name: "fault", Value: "kill", Usage: "what happens to the last-ranked worker: kill (SIGKILL) or stop (SIGSTOP: a hung worker, found by its peers after --comm-timeout)", EnvVars: []string{"ELASTICD_FAULT"}},
			&cli.DurationFlag{Name: "comm-timeout", Value: time.Second, Usage: "the job's --comm-timeout (what a stopped worker costs at least)", EnvVars: []string{"ELASTICD_COMM_TIMEOUT"}},
			&cli.IntFlag{Name: "flood", Usage: "open this many idle TCP connections to the driver's port just before the kill and hold them (a connection flood; mind this process's open-file limit)", EnvVars: []string{"ELASTICD_FLOOD"}},
		},
		Action: func(c *cli.Context) error {
			_, err := bench.Recovery(c.Context, bench.RecoveryOptions{NP: c.Int("np"), Runs: c.Int("runs"), Trainer: c.String("trainer"),
				Fault: c.String("fault"), CommTimeout: c.Duration("comm-timeout"), Flood: c.Int("flood"), JSON: c.Bool("json"),
				Out: c.App.Writer, Err: c.App.ErrWriter})
			return benchExit(err)
		},
	}
}

func benchNoticeCommand() *cli.Command {
	return &cli.Command{
		Name:  "notice",
		Usage: "time a spot interruption notice on a host's metadata until training goes on without that host",
		Description: `Runs 'elasticd run -np 4 --launcher agent' on this machine with two real agents, each
its own host on a loopback address (127.0.0.2 and 127.0.0.3, two slots each) watching a
simulated EC2 metadata service (IMDSv2) served by this command on 127.0.0.1, and the demo
trainer. In each of --runs jobs it waits for training, puts a spot interruption (2 minutes
ahead) on the metadata of the host that does not hold rank 0, at a random point of the
agent's polling cycle, and measures:

   detect      the notice appears       -> the driver has it (the agent polls every 1 s,
                                           as AWS advises; GCP's agent waits for the change)
   move        the driver has it        -> first step done by the 2 workers left
   total       the notice appears       -> first step done by the 2 workers left
   steps_lost  last step done with the host - the step training resumed at (0: no rollback)

and prints the medians over the runs.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "runs", Value: 5, Usage: "jobs to run; medians are over them", EnvVars: []string{"ELASTICD_RUNS"}},
			&cli.StringFlag{Name: "program", Value: bench.ProgramGo, Usage: "what the job trains: go (the demo trainer, worker.State) or torch (bench/pytorch/soak_train.py: elasticd.torch in-process, gloo; built into this binary)", EnvVars: []string{"ELASTICD_PROGRAM"}},
			&cli.StringFlag{Name: "trainer", Usage: "with --program go: the demo trainer binary (default: train beside elasticd, as make build puts it)", EnvVars: []string{"ELASTICD_TRAINER"}},
			&cli.StringFlag{Name: "python", Usage: "with --program torch: an interpreter that imports torch (default: /usr/bin/python3, then python3)", EnvVars: []string{"ELASTICD_PYTHON"}},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object", EnvVars: []string{"ELASTICD_JSON"}},
		},
		Action: func(c *cli.Context) error {
			_, err := bench.Notice(c.Context, bench.NoticeOptions{Runs: c.Int("runs"), Trainer: c.String("trainer"), JSON: c.Bool("json"),
				Out: c.App.Writer, Err: c.App.ErrWriter})
			return benchExit(err)
		},
	}
}

func benchSoakCommand() *cli.Command {
	return &cli.Command{
		Name:  "soak",
		Usage: "run an agent job for a long time under random faults, then check the whole history",
		Description: `Runs 'elasticd run --launcher agent --state-dir' on this machine with --hosts real agents,
each its own host on a loopback address (127.0.0.2 up, --slots each), hosts discovered by a
script, and a program that logs, on every rank, the samples of every step it trains and
every commit: the demo trainer (--program go, worker.State) or a PyTorch script on
elasticd.torch in-process with gloo (--program torch, built into this binary). For
--duration a nemesis applies faults drawn from --seed, one at a time, each healed before
the next, 2 to 6 s apart:

   worker-kill      a worker SIGKILLed
   worker-stop      a worker SIGSTOPped (the job must kill it within --comm-timeout + 1 s;
                    PyTorch: the formation timeout, 15 s here, + 1 s)
   agent-kill       an agent SIGKILLed (its host lost), started again 2-4 s later
   agent-stop       an agent SIGSTOPped for 2-4 s (its host frozen), then SIGCONT
   notice           elasticd ctl remove-host, then add-host 2-4 s later
   flap             a worker SIGKILLed, then its slot's next worker as soon as it starts
   driver-kill      the driver SIGKILLed, started again 1-2 s later on its --state-dir
   driver-term      the driver SIGTERMed (it leaves the job running), started again
   driver-stop      the driver SIGSTOPped for 2-4 s, then SIGCONT
   driver-away      the driver SIGKILLed, then a worker while it is down; the driver
                    started again 1-2 s later
   double-kill      two workers of two hosts SIGKILLed at once
   discovery-error  the discovery script fails for 3-6 s
   discovery-hang   the discovery script hangs past --discovery-timeout for 3-6 s

With --netns (Linux, root, iproute2 and tc) the driver and each agent run in their own
network namespace on 10.251.9.0/24, joined by a bridge, and four network faults join them:

   cut-peers        a host cut off from the other hosts, both ways (not from the driver),
                    for 3-6 s
   cut-one-way      a host's packets to the other hosts dropped, theirs still arriving
   cut-driver       a host cut off from the driver, both ways (not from its peers)
   slow-link        a host's link throttled to 64 kbit/s, packets queued past 5 ms dropped

--faults draws from the kinds named instead (e.g. --faults cut-peers,slow-link).

Then the program is told to stop (it ends at its next commit, and the job with exit 0), the agents are stopped,
and it checks: the final lineage of steps has every step once; no committed step trained
again; every sample once per epoch (PyTorch's sampler may repeat up to world size - 1 in an
epoch's last step, as torch's DistributedSampler pads); no stall beyond its fault's bound;
the driver's exit 0; no process left; the driver's and agents' descriptors, memory and
goroutines (each logs them on SIGUSR1) flat.
It prints the seed and every fault as it applies it, then the summary; it exits 1 on any
violation. Interrupted (Ctrl-C, SIGTERM), it ends the job, checks the history so far, and
exits 130 when that holds. docs/reliability.md ("Soak") gives the bounds.

Examples:
   elasticd bench soak --seed 1 --duration 5m
   elasticd bench soak --program torch --seed 1 --duration 2m --log-dir /tmp/soak
   sudo elasticd bench soak --netns --seed 1 --duration 10m`,
		Flags: []cli.Flag{
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the fault schedule", EnvVars: []string{"ELASTICD_SEED"}},
			&cli.DurationFlag{Name: "duration", Value: 5 * time.Minute, Usage: "how long faults are applied (10s to 24h)", EnvVars: []string{"ELASTICD_DURATION"}},
			&cli.IntFlag{Name: "hosts", Value: 3, Usage: "agent hosts (3-8)", EnvVars: []string{"ELASTICD_HOSTS"}},
			&cli.IntFlag{Name: "slots", Value: 2, Usage: "slots per host (1-4)", EnvVars: []string{"ELASTICD_SLOTS"}},
			&cli.DurationFlag{Name: "comm-timeout", Value: 2 * time.Second, Usage: "the job's --comm-timeout", EnvVars: []string{"ELASTICD_COMM_TIMEOUT"}},
			&cli.StringFlag{Name: "program", Value: bench.ProgramGo, Usage: "what the job trains: go (the demo trainer, worker.State) or torch (bench/pytorch/soak_train.py: elasticd.torch in-process, gloo; built into this binary)", EnvVars: []string{"ELASTICD_PROGRAM"}},
			&cli.StringFlag{Name: "trainer", Usage: "with --program go: the demo trainer binary (default: train beside elasticd, as make build puts it)", EnvVars: []string{"ELASTICD_TRAINER"}},
			&cli.StringFlag{Name: "python", Usage: "with --program torch: an interpreter that imports torch (default: /usr/bin/python3, then python3)", EnvVars: []string{"ELASTICD_PYTHON"}},
			&cli.BoolFlag{Name: "netns", Usage: "run the driver and each agent in its own network namespace, and add the network faults (Linux, root)", EnvVars: []string{"ELASTICD_NETNS"}},
			&cli.StringSliceFlag{Name: "faults", Usage: "draw only from these fault `KINDS` (comma-separated; default: every kind)", EnvVars: []string{"ELASTICD_FAULTS"}},
			&cli.StringFlag{Name: "log-dir", Usage: "write the driver's, agents' and workers' output to `DIR`, made if missing (default: discarded)", EnvVars: []string{"ELASTICD_LOG_DIR"}},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object", EnvVars: []string{"ELASTICD_JSON"}},
		},
		Action: func(c *cli.Context) error {
			_, err := bench.Soak(c.Context, bench.SoakOptions{Seed: c.Uint64("seed"), Duration: c.Duration("duration"), Hosts: c.Int("hosts"),
				Slots: c.Int("slots"), CommTimeout: c.Duration("comm-timeout"), Program: c.String("program"), Trainer: c.String("trainer"), Python: c.String("python"), LogDir: c.String("log-dir"),
				Netns: c.Bool("netns"), Faults: c.StringSlice("faults"),
				JSON: c.Bool("json"), Out: c.App.Writer, Err: c.App.ErrWriter})
			switch {
			case errors.Is(err, bench.ErrSoakViolation):
				return cli.Exit(err.Error(), 1)
			case errors.Is(err, bench.ErrSoakInterrupted):
				return cli.Exit(err.Error(), 130)
			}
			return benchExit(err)
		},
	}
}

// benchReportCommand summarises JSON lines from several implementations and rounds (the
// output of bench/baselines/run.sh) into medians side by side.
func benchReportCommand() *cli.Command {
	return &cli.Command{
		Name:      "report",
		Usage:     "compare allreduce results of several implementations (JSON lines) side by side",
		ArgsUsage: "[FILE...]",
		Description: `Reads JSON lines as printed by 'bench allreduce --json' and bench/baselines/run.sh
(with an "impl" field; lines without one count as "elasticd") from the files, or from
standard input, and prints for each rank count and size the median time over all
rounds of each implementation, and how many times faster elasticd is than each other.

Example: ROUNDS=3 bench/baselines/run.sh | elasticd bench report`,
		Action: func(c *cli.Context) error {
			return benchExit(bench.Report(bench.ReportOptions{Files: c.Args().Slice(), Stdin: c.App.Reader, Out: c.App.Writer}))
		},
	}
}

// benchRankCommand is one rank of `bench allreduce`, started by it; not for people.
func benchRankCommand() *cli.Command {
	return &cli.Command{
		Name:   bench.RankCommand,
		Hidden: true,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "rank"}, &cli.IntFlag{Name: "np"}, &cli.StringFlag{Name: "store"},
			&cli.StringFlag{Name: "sizes"}, &cli.IntFlag{Name: "iters"}, &cli.IntFlag{Name: "chunk-bytes"},
			&cli.IntFlag{Name: "small-bytes"}, &cli.IntFlag{Name: "tcp-send-buffer"}, &cli.IntFlag{Name: "direct-bytes"}, &cli.StringFlag{Name: "transport"}, &cli.DurationFlag{Name: "timeout"}, &cli.StringFlag{Name: "cpuprofile"},
			&cli.StringFlag{Name: "listen"},
		},
		Action: func(c *cli.Context) error {
			var sizes []int64
			for _, f := range strings.Split(c.String("sizes"), ",") {
				size, err := strconv.ParseInt(f, 10, 64)
				if err != nil {
					return fmt.Errorf("size %q: %w", f, err)
				}
				sizes = append(sizes, size)
			}
			return bench.Rank(c.Context, bench.RankOptions{Rank: c.Int("rank"), NP: c.Int("np"), Store: c.String("store"), Sizes: sizes,
				Iters: c.Int("iters"), ChunkBytes: c.Int("chunk-bytes"), SmallBytes: c.Int("small-bytes"), TCPSendBuffer: c.Int("tcp-send-buffer"), DirectBytes: c.Int("direct-bytes"), Transport: c.String("transport"),
				Timeout: c.Duration("timeout"), CPUProfile: c.String("cpuprofile"), Listen: c.String("listen"), Out: c.App.Writer})
		},
	}
}

// benchPeerCommand is the other end of the TCP measurements of `bench allreduce`; not for
// people. It serves until its parent kills it.
func benchPeerCommand() *cli.Command {
	return &cli.Command{
		Name:   bench.PeerCommand,
		Hidden: true,
		Action: func(c *cli.Context) error { return bench.Peer(c.Context, c.App.Writer) },
	}
}

// benchExit makes a *bench.UsageError exit 2 with its one line, as usageError does.
func benchScaleCommand() *cli.Command {
	return &cli.Command{
		Name:  "scale",
		Usage: "measure what a job of thousands of hosts costs one driver, with simulated hosts",
		Description: `Runs the real driver ('elasticd run --launcher agent --mode inprocess', its own process,
listening on loopback) with --hosts simulated hosts in this process. Each registers as an
agent with --slots slots and holds its session on one connection (its session stream),
as 'elasticd agent' does: the commands poll, the events, and the watch from which the agent's relay
answers its workers. Its workers speak the real worker protocol (the Go rendezvous client,
signed with the job's secret) over that connection: they register when started, take
their places from the watch, go to the barrier (READY) when the hosts change, and exit
when removed. Nothing trains. It measures:

   form          the driver started -> every worker placed in one generation of them all
   reset         a worker fails (its exit, and every other worker's READY as their
                 collectives fail) -> every survivor placed in the next generation; and
                 the driver's CPU time over it
   reclaim       --reclaim of the hosts get spot notices within one second -> every worker
                 of the other hosts placed in a generation without them; how many
                 generations that took (1: one reset), and the driver's CPU time
   driver        its largest RSS and descriptors over the run, its Go heap and
                 goroutines once formed (it logs them on SIGUSR1)
   status        GET /v1/status and /metrics: median time of 5, and size; the live
                 page's size
   live page     the page of hosts it asks for each second (GET /v1/status?limit=100):
                 median time of 5, and size; its first paint in headless Chromium, from
                 the navigation to the job drawn, median of 3 (not measured without a
                 Chromium: make test-deps installs one)

With --json it prints one object: hosts, workers, form_s, reset_s, reset_cpu_s,
reclaim_hosts, reclaim_reset_s, reclaim_generations, reclaim_cpu_s, driver_rss_bytes,
driver_fds, driver_heap_bytes, driver_goroutines, status_ms, status_bytes, metrics_ms,
metrics_bytes, page_bytes, page_status_ms, page_status_bytes, page_paint_ms (-1: not
measured). The simulated hosts share the machine with the driver: on a
small machine their own work is part of every time measured. It raises its open-file
limit to the hard limit (the driver inherits it): each host holds a connection.

Examples:
   elasticd bench scale --hosts 1000 --slots 8
   elasticd bench scale --hosts 10000 --slots 8 --json`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "hosts", Value: 1000, Usage: "simulated hosts (2-100000)", EnvVars: []string{"ELASTICD_HOSTS"}},
			&cli.IntFlag{Name: "slots", Value: 8, Usage: "workers per host (1-64)", EnvVars: []string{"ELASTICD_SLOTS"}},
			&cli.Float64Flag{Name: "reclaim", Value: 0.1, Usage: "share of the hosts given spot notices within one second (0 < share < 0.5)", EnvVars: []string{"ELASTICD_RECLAIM"}},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Minute, Usage: "longest wait for each phase (forming, the reset, the reclaim)", EnvVars: []string{"ELASTICD_TIMEOUT"}},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object", EnvVars: []string{"ELASTICD_JSON"}},
			&cli.BoolFlag{Name: "quiet", Usage: "do not log the phases on stderr", EnvVars: []string{"ELASTICD_QUIET"}},
		},
		Action: func(c *cli.Context) error {
			o := bench.ScaleOptions{Hosts: c.Int("hosts"), Slots: c.Int("slots"), Reclaim: c.Float64("reclaim"), Timeout: c.Duration("timeout"),
				JSON: c.Bool("json"), Out: c.App.Writer, Err: c.App.ErrWriter}
			if c.Bool("quiet") {
				o.Err = nil
			}
			_, err := bench.Scale(c.Context, o)
			return benchExit(err)
		},
	}
}

func benchExit(err error) error {
	if ue := (*bench.UsageError)(nil); errors.As(err, &ue) {
		return cli.Exit(ue.Error(), 2)
	}
	return err
}
