package driver

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// saved runs a 3-worker in-process job to its first generation, fails h2 once (blacklisted),
// and returns the machine's saved state: what a driver killed now leaves in --state-dir.
func savedJob(t *testing.T) (*sim, SavedState) {
	t.Helper()
	s := newSim(t, Config{NP: 3, MinNP: 2, Mode: ModeInProcess, CooldownMin: time.Minute, CooldownMax: time.Minute})
	s.start(3)
	s.exit("h2", 137)
	s.ready(1, "h0", "h1")
	st := s.m.Save(s.now)
	if st.Generation != 2 || len(st.Workers) != 2 || st.FailureResets != 1 || len(st.Blacklist) != 1 || st.Blacklist[0].ID != "h2/0" {
		t.Fatalf("saved %+v", st)
	}
	return s, st
}

// A restarted driver that adopts the workers takes their generation up as it was: no
// Publish, no Launch, no NotifyHosts, however discovery answers while the agents come back.
func TestRestoreAdoptsTheGenerationWithoutAReset(t *testing.T) {
	s, st := savedJob(t)
	r := &sim{t: t, m: NewMachine(s.m.cfg), now: s.now.Add(time.Second)}
	acts := r.m.Restore(r.now, &st, true, time.Minute)
	if has[Publish](acts) || has[Launch](acts) || r.m.Generation() != 2 || r.m.WorldSize() != 2 {
		t.Fatalf("restore: %v, generation %d, world %d", acts, r.m.Generation(), r.m.WorldSize())
	}
	// The agents are not back yet: discovery lists one host of three; nothing happens.
	acts = r.after(time.Second).hosts("h0")
	if has[NotifyHosts](acts) || has[Publish](acts) || len(stopped(acts)) > 0 {
		t.Fatalf("a partial discovery during the adoption acted: %v", acts)
	}
	acts = append(r.m.Step(WorkerAdopted{Now: r.now, Worker: wid("h0")}), r.m.Step(WorkerAdopted{Now: r.now, Worker: wid("h1")})...)
	if has[NotifyHosts](acts) {
		t.Fatalf("adoption settled before discovery listed the members: %v", acts)
	}
	// Discovery catches up, with the blacklisted h2 too: the generation goes on unchanged.
	acts = r.after(time.Second).hosts("h0", "h1", "h2")
	if has[NotifyHosts](acts) || has[Publish](acts) || r.m.adopting() {
		t.Fatalf("after the adoption: %v (adopting %v)", acts, r.m.adopting())
	}
	if bl := r.m.hosts.Blacklisted(r.now); len(bl) != 1 || bl[0].ID != "h2/0" {
		t.Fatalf("blacklist after restore %v", bl)
	}
	// The job goes on as ever: h2's cooldown ends, the world grows back.
	acts = r.after(time.Minute).tick()
	if !has[NotifyHosts](acts) {
		t.Fatalf("h2 came back after its cooldown, yet %v", acts)
	}
	if r.m.Resets().All != 1 || r.m.Resets().Failures != 1 {
		t.Fatalf("reset counts %d/%d: want the saved ones", r.m.Resets().All, r.m.Resets().Failures)
	}
}

// A cooldown that ends while a restarted driver adopts its workers waits for the adoption's
// end, which applies discovery: the ticks before it do not, so it is no deadline of theirs
// (else, always due, it would have the loop tick without pause).
func TestCooldownEndingDuringAdoptionIsNoDeadline(t *testing.T) {
	s, st := savedJob(t)
	r := &sim{t: t, m: NewMachine(s.m.cfg), now: s.now.Add(time.Second)}
	r.m.Restore(r.now, &st, true, 2*time.Minute)
	adoptUntil := r.now.Add(2 * time.Minute)
	r.after(70 * time.Second).tick() // h2's cooldown ended 10 s ago; nobody was adopted yet
	if dl := r.m.NextDeadline(r.now); !dl.Equal(adoptUntil) {
		t.Fatalf("next deadline %v at %v while adopting, want the adoption's end %v", dl, r.now, adoptUntil)
	}
}

// A member no agent hands back fails as a lost worker does; the others reset without it.
func TestRestoreMemberNotAdoptedFails(t *testing.T) {
	s, st := savedJob(t)
	r := &sim{t: t, m: NewMachine(s.m.cfg), now: s.now}
	r.m.Restore(r.now, &st, true, time.Minute)
	r.m.Step(WorkerAdopted{Now: r.now, Worker: wid("h0")})
	acts := r.after(time.Minute).exit("h1", -1) // the registry gives up on it at the deadline
	if !has[Abandon](acts) {
		t.Fatalf("a lost member should reset the generation: %v", acts)
	}
	r.hosts("h0", "h1", "h2")
	acts = r.ready(2, "h0")
	r.expectPlan(acts, 3, "h0", "h2") // h1 cools down now; h2's cooldown is over
	if r.m.adopting() {
		t.Fatal("still adopting after a reset")
	}
}

// A generation saved in the middle of its reset: the members already at the barrier wait for
// the next generation, which the restarted driver plans once it has found them.
func TestRestoreMidResetPlansTheNextGeneration(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, Mode: ModeInProcess})
	s.start(3)
	s.m.Step(WorkerReported{Now: s.now, Worker: wid("h0"), Generation: 1, State: protocol.Ready, Message: "peer lost"})
	st := s.m.Save(s.now)
	if !st.Resetting || len(st.Workers) != 3 {
		t.Fatalf("saved %+v", st)
	}
	r := &sim{t: t, m: NewMachine(s.m.cfg), now: s.now}
	if acts := r.m.Restore(r.now, &st, true, time.Minute); has[Publish](acts) {
		t.Fatalf("planned before finding its members: %v", acts)
	}
	var acts []Action
	for _, h := range []string{"h0", "h1", "h2"} {
		acts = append(acts, r.m.Step(WorkerAdopted{Now: r.now, Worker: wid(h)})...)
	}
	acts = append(acts, r.hosts("h0", "h1", "h2")...)
	r.expectPlan(acts, 2, "h0", "h1", "h2")
	if len(launched(acts)) != 0 {
		t.Fatalf("launched %v: the members are running", launched(acts))
	}
}

// Without agents the workers died with the driver: the restarted one starts the next
// generation anew (from the checkpoint), keeping the generation count and the blacklist.
func TestRestoreWithoutAdoptionStartsAgain(t *testing.T) {
	s, st := savedJob(t)
	r := &sim{t: t, m: NewMachine(Config{NP: 3, MinNP: 2, Mode: ModeInProcess, CheckpointDir: "/ckpt", CooldownMin: time.Minute, CooldownMax: time.Minute}), now: s.now}
	acts := r.m.Restore(r.now, &st, false, time.Minute)
	if has[Publish](acts) {
		t.Fatalf("%v", acts)
	}
	acts = r.hosts("h0", "h1", "h2")
	r.expectPlan(acts, 3, "h0", "h1")
	if got := launched(acts); !slices.Equal(got, []string{"h0", "h1"}) {
		t.Fatalf("launched %v", got)
	}
	if !strings.Contains(eventsText(r.m.Snapshot()), "starts again from the newest checkpoint in /ckpt") {
		t.Fatal("the journal does not say the job starts again from the checkpoint")
	}
}

// The state file: written only when it changes, read back whole, and refused with advice
// when it is not ours; one driver per directory.
func TestStateDirSaveLoadLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	sd, err := openStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openStateDir(dir); err == nil || !strings.Contains(err.Error(), "another driver") {
		t.Fatalf("a second driver on the directory: %v", err)
	}
	if st, err := LoadState(dir); st != nil || err != nil {
		t.Fatalf("empty dir: %v %v", st, err)
	}
	_, st := savedJob(t)
	st.JobID, st.HostsVersion = "abcd", 3
	if err := sd.save(st); err != nil {
		t.Fatal(err)
	}
	info1, _ := os.Stat(filepath.Join(dir, StateFile))
	if info1.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v", info1.Mode().Perm())
	}
	time.Sleep(10 * time.Millisecond)
	if err := sd.save(st); err != nil {
		t.Fatal(err)
	}
	if info2, _ := os.Stat(filepath.Join(dir, StateFile)); !info2.ModTime().Equal(info1.ModTime()) {
		t.Fatal("an unchanged state was written again")
	}
	got, err := LoadState(dir)
	if err != nil || got.JobID != "abcd" || got.Generation != 2 || len(got.Workers) != 2 || got.HostsVersion != 3 || got.SavedAt.IsZero() {
		t.Fatalf("loaded %+v, %v", got, err)
	}
	sd.close()
	if sd, err = openStateDir(dir); err != nil {
		t.Fatalf("the lock outlived its driver: %v", err)
	}
	defer sd.close()
	for _, bad := range []string{"{", `{"version": 9, "job_id": "x"}`, `{"version": 1}`, `{"version": 1, "job_id": "x", "surprise": 1}`,
		`{"version": 1, "job_id": "x", "workers": [{"worker": "no-slot"}]}`} {
		os.WriteFile(filepath.Join(dir, StateFile), []byte(bad), 0o600)
		if _, err := LoadState(dir); err == nil || !strings.Contains(err.Error(), "move it away") {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if err := sd.remove(); err != nil {
		t.Fatal(err)
	}
	if st, err := LoadState(dir); st != nil || err != nil {
		t.Fatalf("after remove: %v %v", st, err)
	}
}

// The journal goes through --state-dir: a restarted driver shows the job's start, each
// host's time in the group (its cost goes on counting), failures, events, resets by cause
// and world sizes from before its own start, and adds its own after them.
func TestRestoreTakesUpTheJournal(t *testing.T) {
	s, st := savedJob(t)
	st.Journal = s.m.SaveJournal()
	before := s.m.Snapshot()
	r := &sim{t: t, m: NewMachine(s.m.cfg), now: s.now.Add(time.Minute)}
	r.m.Restore(r.now, &st, true, time.Minute)
	after := r.m.Snapshot()
	if !after.StartedAt.Equal(before.StartedAt) {
		t.Errorf("started at %v after the restart, want the job's start %v", after.StartedAt, before.StartedAt)
	}
	if i := slices.IndexFunc(after.Hosts, func(h HostStatus) bool { return h.ID == "h2" }); i < 0 || after.Hosts[i].Count != 1 || after.Hosts[i].Last == nil {
		t.Errorf("h2's failures after the restart: %+v, want the one before it", after.Hosts)
	}
	if after.ResetsByCause[CauseFailure] != before.ResetsByCause[CauseFailure] || before.ResetsByCause[CauseFailure] == 0 {
		t.Errorf("resets by cause %v after the restart, %v before", after.ResetsByCause, before.ResetsByCause)
	}
	if len(after.Events) <= len(before.Events) || !slices.Equal(after.Events[:len(before.Events)], before.Events) {
		t.Errorf("events after the restart do not begin with those before it:\n%v\n%v", after.Events, before.Events)
	}
	if len(before.WorldHistory) < 2 || len(after.WorldHistory) < len(before.WorldHistory) || !slices.Equal(after.WorldHistory[:len(before.WorldHistory)], before.WorldHistory) {
		t.Errorf("world history %v after the restart, %v before", after.WorldHistory, before.WorldHistory)
	}
	// Each host's stay goes on from before the restart: its time counts the driver's absence.
	if len(after.lives) != len(before.lives) || len(after.lives) == 0 {
		t.Fatalf("%d hosts' lives after the restart, %d before", len(after.lives), len(before.lives))
	}
	for i, l := range after.lives {
		if len(l.stays) != 1 || !l.stays[0].From.Equal(before.lives[i].stays[0].From) || !l.stays[0].To.IsZero() {
			t.Errorf("host %s's stays after the restart %v, before %v", l.host.ID, l.stays, before.lives[i].stays)
		}
	}
	r.after(time.Second).hosts("h0", "h1") // h2 is gone from the group: its stay ends now
	for _, l := range r.m.Snapshot().lives {
		if l.host.ID == "h2" && (len(l.stays) != 1 || !l.stays[0].To.Equal(r.now)) {
			t.Errorf("h2's stays once discovery no longer lists it: %v", l.stays)
		}
	}
}
