package driver

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// Golden transcripts of the machine (driver/testdata/transcripts/*.txt). Each file is a script
// of events, one command per paragraph, each followed by "----" and what the machine did: its
// actions, one a line, and its state. The test replays the commands and compares; with -update
// it writes what the machine does now, so that a change of behaviour shows as a diff to review.
//
// Commands (an optional leading +DURATION first advances the clock):
//
//	config np=N [min=N] [max=N] [mode=inprocess|restart] [reset-limit=N] [elastic-timeout=D] [barrier-timeout=D] [start-timeout=D]
//	hosts ID:SLOTS[:leaving] ...          discovery's answer
//	ready WORKER GEN [MESSAGE]            a report of READY after generation GEN
//	success WORKER GEN | failure WORKER GEN [MESSAGE]
//	exit WORKER CODE | exit WORKER SIGNAL  a worker process ended
//	started WORKER GEN                    a Launch for generation GEN was carried out
//	launch-failed WORKER GEN [ERROR]      a Launch for generation GEN started nothing
//	notice HOST ID [KIND] [+DEADLINE]     an interruption notice
//	slots-failed HOST SLOT,... [REASON]   GPUs under slots failed
//	tick                                  the clock reached the machine's deadline (or now)
//	interrupt                             SIGINT
var update = flag.Bool("update", false, "rewrite driver/testdata/transcripts/*.txt with what the machine does now")

// transcriptT0 is the transcripts' clock at +0s.
var transcriptT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestTranscripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "transcripts", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts in testdata/transcripts: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			got := replay(t, string(data))
			if *update {
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != string(data) {
				t.Errorf("the machine no longer does what %s says; if the change is meant, run go test ./driver -run TestTranscripts -update and review the diff.\n%s", file, lineDiff(string(data), got))
			}
		})
	}
}

// replay runs a transcript's commands and returns the transcript with their outputs written
// fresh; comments (lines starting with #) and blank lines between paragraphs are kept.
func replay(t *testing.T, script string) string {
	var out strings.Builder
	r := &transcript{now: transcriptT0}
	paragraphs := strings.Split(strings.TrimRight(script, "\n"), "\n\n")
	for i, p := range paragraphs {
		if i > 0 {
			out.WriteString("\n")
		}
		cmdPart, _, _ := strings.Cut(p, "\n----")
		var cmd []string
		for _, l := range strings.Split(cmdPart, "\n") {
			if strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "" {
				out.WriteString(l + "\n")
				continue
			}
			cmd = append(cmd, l)
		}
		if len(cmd) == 0 {
			continue
		}
		if len(cmd) > 1 {
			t.Fatalf("paragraph %d has %d commands, want one: %q", i+1, len(cmd), cmd)
		}
		out.WriteString(cmd[0] + "\n----\n")
		res, err := r.run(cmd[0])
		if err != nil {
			t.Fatalf("%q: %v", cmd[0], err)
		}
		out.WriteString(res)
	}
	return out.String()
}

type transcript struct {
	m   *Machine
	now time.Time
}

func (r *transcript) run(line string) (string, error) {
	f := strings.Fields(line)
	if strings.HasPrefix(f[0], "+") {
		d, err := time.ParseDuration(f[0][1:])
		if err != nil {
			return "", fmt.Errorf("clock step %q: %v", f[0], err)
		}
		r.now = r.now.Add(d)
		f = f[1:]
	}
	if len(f) == 0 {
		return "", fmt.Errorf("no command")
	}
	if f[0] == "config" {
		cfg, err := parseConfig(f[1:])
		if err != nil {
			return "", err
		}
		r.m = NewMachine(cfg)
		return r.state(), nil
	}
	if r.m == nil {
		return "", fmt.Errorf("%s before config", f[0])
	}
	ev, err := r.event(f[0], f[1:])
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, a := range r.m.Step(ev) {
		b.WriteString(formatAction(a, r.now) + "\n")
	}
	b.WriteString(r.state())
	return b.String(), nil
}

func (r *transcript) state() string {
	if r.m == nil {
		return "state: no machine\n"
	}
	s := fmt.Sprintf("state: %s gen=%d world=%d", phaseNames[r.m.phase], r.m.Generation(), r.m.WorldSize())
	if d := r.m.NextDeadline(r.now); !d.IsZero() {
		s += " next=+" + d.Sub(transcriptT0).String()
	}
	return s + "\n"
}

func parseConfig(args []string) (Config, error) {
	var c Config
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return c, fmt.Errorf("config %q: want key=value", a)
		}
		var err error
		switch k {
		case "np":
			c.NP, err = strconv.Atoi(v)
		case "min":
			c.MinNP, err = strconv.Atoi(v)
		case "max":
			c.MaxNP, err = strconv.Atoi(v)
		case "reset-limit":
			c.ResetLimit, err = strconv.Atoi(v)
		case "mode":
			c.Mode = Mode(v)
		case "elastic-timeout":
			c.ElasticTimeout, err = time.ParseDuration(v)
		case "barrier-timeout":
			c.BarrierTimeout, err = time.ParseDuration(v)
		case "start-timeout":
			c.StartTimeout, err = time.ParseDuration(v)
		default:
			return c, fmt.Errorf("config: unknown key %q", k)
		}
		if err != nil {
			return c, fmt.Errorf("config %s: %v", k, err)
		}
	}
	return c, nil
}

func (r *transcript) event(name string, args []string) (Event, error) {
	need := func(n int) error {
		if len(args) < n {
			return fmt.Errorf("%s needs %d arguments, got %d", name, n, len(args))
		}
		return nil
	}
	worker := func(s string) (protocol.WorkerID, error) { return protocol.ParseWorkerID(s) }
	// workerGen reads the arguments WORKER GEN.
	workerGen := func() (protocol.WorkerID, uint64, error) {
		if err := need(2); err != nil {
			return protocol.WorkerID{}, 0, err
		}
		id, err := worker(args[0])
		if err != nil {
			return id, 0, err
		}
		gen, err := strconv.ParseUint(args[1], 10, 64)
		return id, gen, err
	}
	rest := func(from int) string {
		if len(args) <= from {
			return ""
		}
		return strings.Join(args[from:], " ")
	}
	switch name {
	case "hosts":
		var hs []providers.Host
		for _, a := range args {
			p := strings.Split(a, ":")
			if len(p) < 2 {
				return nil, fmt.Errorf("host %q: want ID:SLOTS[:leaving]", a)
			}
			n, err := strconv.Atoi(p[1])
			if err != nil {
				return nil, fmt.Errorf("host %q: %v", a, err)
			}
			hs = append(hs, providers.Host{ID: p[0], Addr: p[0], Slots: n, Leaving: len(p) > 2 && p[2] == "leaving"})
		}
		return HostsDiscovered{Now: r.now, Hosts: hs}, nil
	case "ready", "success", "failure":
		id, gen, err := workerGen()
		if err != nil {
			return nil, err
		}
		st := map[string]protocol.State{"ready": protocol.Ready, "success": protocol.Success, "failure": protocol.Failure}[name]
		return WorkerReported{Now: r.now, Worker: id, Generation: gen, State: st, Message: rest(2)}, nil
	case "exit":
		if err := need(2); err != nil {
			return nil, err
		}
		id, err := worker(args[0])
		if err != nil {
			return nil, err
		}
		if strings.HasPrefix(args[1], "SIG") {
			return WorkerExited{Now: r.now, Worker: id, Code: -1, Signal: args[1]}, nil
		}
		code, err := strconv.Atoi(args[1])
		if err != nil {
			return nil, err
		}
		return WorkerExited{Now: r.now, Worker: id, Code: code}, nil
	case "started", "launch-failed":
		id, gen, err := workerGen()
		if err != nil {
			return nil, err
		}
		if name == "started" {
			return WorkerStarted{Now: r.now, Worker: id, Generation: gen}, nil
		}
		return LaunchFailed{Now: r.now, Worker: id, Generation: gen, Err: errors.New(rest(2))}, nil
	case "notice":
		if err := need(2); err != nil {
			return nil, err
		}
		n := providers.Notice{HostID: args[0], ID: args[1], Kind: providers.Interruption}
		for _, a := range args[2:] {
			if strings.HasPrefix(a, "+") {
				d, err := time.ParseDuration(a[1:])
				if err != nil {
					return nil, err
				}
				n.Deadline = r.now.Add(d)
			} else {
				n.Kind = providers.NoticeKind(a)
			}
		}
		return NoticeReceived{Now: r.now, Notice: n, Source: "transcript"}, nil
	case "slots-failed":
		if err := need(2); err != nil {
			return nil, err
		}
		var slots []int
		for _, s := range strings.Split(args[1], ",") {
			n, err := strconv.Atoi(s)
			if err != nil {
				return nil, err
			}
			slots = append(slots, n)
		}
		return SlotsFailed{Now: r.now, Host: args[0], Slots: slots, Reason: rest(2)}, nil
	case "tick":
		if d := r.m.NextDeadline(r.now); !d.IsZero() && d.After(r.now) {
			r.now = d
		}
		return Tick{Now: r.now}, nil
	case "interrupt":
		return Interrupted{Now: r.now, Reason: "interrupt"}, nil
	}
	return nil, fmt.Errorf("unknown command %q", name)
}

// formatAction writes an action on one line, stable across runs.
func formatAction(a Action, now time.Time) string {
	switch a := a.(type) {
	case Launch:
		s := fmt.Sprintf("launch %s gen=%d rank=%d/%d local=%d/%d group=%d/%d", a.Worker, a.Generation, a.Assignment.Rank, a.Assignment.Size, a.Assignment.LocalRank, a.Assignment.LocalSize, a.Group, a.Groups)
		if a.Restarts > 0 {
			s += fmt.Sprintf(" restarts=%d", a.Restarts)
		}
		if a.InProcess {
			s += " in-process"
		}
		return s
	case Stop:
		s := fmt.Sprintf("stop %s (%s)", a.Worker, a.Reason)
		if !a.Deadline.IsZero() {
			s += " by +" + a.Deadline.Sub(transcriptT0).String()
		}
		return s
	case Publish:
		ids := slices.SortedFunc(maps.Keys(a.Plan), func(x, y protocol.WorkerID) int { return a.Plan[x].Rank - a.Plan[y].Rank })
		var parts []string
		for _, id := range ids {
			parts = append(parts, fmt.Sprintf("%s=%d", id, a.Plan[id].Rank))
		}
		return fmt.Sprintf("publish gen=%d %s", a.Generation, strings.Join(parts, " "))
	case NotifyHosts:
		return "notify-hosts"
	case Abandon:
		return fmt.Sprintf("abandon gen=%d (%s)", a.Generation, a.Reason)
	case CompleteNotice:
		return fmt.Sprintf("complete-notice %s on %s", a.Notice.ID, a.Notice.HostID)
	case GenerationReady:
		return fmt.Sprintf("generation-ready gen=%d world=%d after %v", a.Generation, a.WorldSize, a.Latency)
	case Finish:
		return fmt.Sprintf("finish code=%d (%s)", a.Code, a.Reason)
	case Warn:
		return "warn: " + strings.TrimPrefix(formatAction(Note(a), now), "note: ")
	case Note:
		var kv []string
		for i := 0; i+1 < len(a.Args); i += 2 {
			v := a.Args[i+1]
			if tm, ok := v.(time.Time); ok {
				v = "+" + tm.Sub(transcriptT0).String()
			}
			kv = append(kv, fmt.Sprintf("%v=%v", a.Args[i], v))
		}
		return strings.TrimSpace("note: " + a.Msg + " " + strings.Join(kv, " "))
	}
	return fmt.Sprintf("%T %+v", a, a)
}

// lineDiff shows the first lines where want and got differ, with a little context.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	from := max(0, i-3)
	var b strings.Builder
	fmt.Fprintf(&b, "first difference at line %d:\n", i+1)
	for j := from; j < i; j++ {
		b.WriteString("  " + w[j] + "\n")
	}
	for j := i; j < min(len(w), i+6); j++ {
		b.WriteString("- " + w[j] + "\n")
	}
	for j := i; j < min(len(g), i+6); j++ {
		b.WriteString("+ " + g[j] + "\n")
	}
	return b.String()
}
