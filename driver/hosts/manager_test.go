package hosts_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/hosts"
	"github.com/elasticd/elasticd/providers"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

var hostRE = regexp.MustCompile(`^([^:@/]+)(?::(\d+))?(?:@(\d+))?(?:/(\S+))?$`)

// parseHosts reads "id[:slots][@launched][/addr] ...": slots default to 1, launched is in
// seconds after t0 (zero time when absent), addr defaults to the ID.
func parseHosts(t *testing.T, s string) []providers.Host {
	t.Helper()
	var hs []providers.Host
	for _, f := range strings.Fields(s) {
		m := hostRE.FindStringSubmatch(f)
		if m == nil {
			t.Fatalf("bad host %q in test", f)
		}
		h := providers.Host{ID: m[1], Addr: m[1], Slots: 1}
		if m[2] != "" {
			h.Slots, _ = strconv.Atoi(m[2])
		}
		if m[3] != "" {
			sec, _ := strconv.Atoi(m[3])
			h.Launched = at(sec)
		}
		if m[4] != "" {
			h.Addr = m[4]
		}
		hs = append(hs, h)
	}
	return hs
}

func ids(hs []providers.Host) string {
	s := make([]string, len(hs))
	for i, h := range hs {
		s[i] = h.ID
	}
	return strings.Join(s, " ")
}

// step is one call. Verbs: "update <hosts>", "fail <id>", "leave <id>", "clear <id>", "advance" check
// the call's result against changed, then Usable against want unless want is "?"; "look"
// checks Usable only; "next" checks NextEvent (want: seconds after t0, or "none");
// "black" checks Blacklisted (want: "id:failures@until ...").
type step struct {
	at      int
	do      string
	want    string
	changed bool
}

func TestManagerScenarios(t *testing.T) {
	tests := []struct {
		name  string
		cfg   hosts.Config
		steps []step
	}{
		{"first order is launch time then ID", hosts.Config{}, []step{
			{0, "update c a@5 b@5 d", "c d a b", true},
		}},
		{"digit runs in IDs compare by value", hosts.Config{}, []step{
			{0, "update local-10 local-2 local-11 local-0 local-1", "local-0 local-1 local-2 local-10 local-11", true},
		}},
		{"digit runs in addresses and ties", hosts.Config{}, []step{
			{0, "update 10.0.0.100 10.0.0.10 10.0.0.9 a1 a01 a001b a1a b", "10.0.0.9 10.0.0.10 10.0.0.100 a01 a1 a1a a001b b", true},
		}},
		{"survivors keep their order and new hosts go to the end", hosts.Config{}, []step{
			{0, "update b c", "b c", true},
			{1, "update a b c", "b c a", true},
			{2, "update c a b", "b c a", false},
			{3, "update e@9 d@1 c b a", "b c a d e", true},
			{4, "update a e", "a e", true},
			{5, "update e a", "a e", false},
		}},
		{"a removed host that returns is new", hosts.Config{}, []step{
			{0, "update a b c", "a b c", true},
			{1, "update a c", "a c", true},
			{2, "update a b c", "a c b", true},
		}},
		{"a slot count change keeps the place and is a change", hosts.Config{}, []step{
			{0, "update a b c", "a b c", true},
			{1, "update a b:4 c", "a b c", true},
			{2, "update a b:4 c", "a b c", false},
			{3, "update a b:0 c", "a c", true},
			{4, "update a b:2 c", "a c b", true},
		}},
		{"an address change is a change", hosts.Config{}, []step{
			{0, "update a b", "a b", true},
			{1, "update a b/10.0.0.9", "a b", true},
			{2, "update b/10.0.0.9 a", "a b", false},
		}},
		{"an empty group", hosts.Config{}, []step{
			{0, "update", "", false},
			{1, "update a", "a", true},
			{2, "update", "", true},
		}},
		{"first cooldown is CooldownMin, and the host returns when it ends", hosts.Config{}, []step{
			{0, "update a b c", "a b c", true},
			{0, "fail b", "a c", true},
			{0, "next", "10", false},
			{0, "black", "b:1@10", false},
			{9, "look", "a c", false},
			{10, "look", "a c b", false},
			{10, "next", "none", false},
			{10, "black", "", false},
			{11, "update a b c", "a c b", false},
		}},
		{"failures during a cooldown are not counted", hosts.Config{}, []step{
			{0, "update a b", "a b", true},
			{0, "fail a", "b", true},
			{0, "fail a", "b", false},
			{5, "fail a", "b", false},
			{5, "black", "a:1@10", false},
			{10, "fail a", "b", false},
			{10, "black", "a:2@30", false},
		}},
		{"a blacklisted host that leaves and returns before its cooldown ends", hosts.Config{}, []step{
			{0, "update a b c", "a b c", true},
			{0, "fail b", "a c", true},
			{2, "update a c", "a c", false},
			{2, "next", "none", false},
			{5, "update a b c", "a c", false},
			{5, "next", "10", false},
			{10, "look", "a c b", false},
		}},
		{"a blacklisted host gone when its cooldown ends waits for discovery", hosts.Config{}, []step{
			{0, "update a b c", "a b c", true},
			{0, "fail b", "a c", true},
			{2, "update a c", "a c", false},
			{10, "look", "a c", false},
			{10, "black", "", false},
			{30, "update a b c", "a c b", true},
			{40, "fail b", "a c", true},
			{40, "black", "b:2@60", false}, // it kept its failure count while it was gone
		}},
		{"blacklisting a host never seen", hosts.Config{}, []step{
			{0, "update a", "a", true},
			{0, "fail x", "a", false},
			{1, "update a x", "a", false},
			{10, "look", "a x", false},
		}},
		{"cooldowns that end together: launch time then ID", hosts.Config{}, []step{
			{0, "update a b c d@1", "a b c d", true},
			{0, "fail d", "a b c", true},
			{0, "fail b", "a c", true},
			{0, "fail a", "c", true},
			{15, "look", "c a b d", false},
		}},
		{"Advance reports a cooldown's end", hosts.Config{}, []step{
			{0, "update a b c", "a b c", true},
			{0, "fail b", "a c", true},
			{9, "advance", "a c", false},
			{10, "advance", "a c b", true},
			{11, "advance", "a c b", false},
			{12, "fail c", "?", true},
			{22, "advance", "a b c", true}, // no look in between: the drop and the return together
		}},
		{"hosts return in the order their cooldowns end, unobserved", hosts.Config{}, []step{
			{0, "update a b c d", "a b c d", true},
			{0, "fail b", "a c d", true},
			{3, "fail a", "c d", true},
			{20, "update a b c d e@0", "c d b a e", true}, // b at 10, a at 13, then the new e
			{21, "update a b c d e", "c d b a e", false},
		}},
		{"an expiry nobody looked at is reported by the next call", hosts.Config{}, []step{
			{0, "update a b c", "a b c", true},
			{0, "fail c", "?", true},
			{15, "update a b c", "a b c", true},
		}},
		{"an expiry seen through Usable is not reported again", hosts.Config{}, []step{
			{0, "update a b c", "a b c", true},
			{0, "fail c", "a b", true},
			{10, "look", "a b c", false},
			{11, "update a b c", "a b c", false},
		}},
		{"an expiry nobody applied stays the next event, however late it is asked", hosts.Config{}, []step{
			{0, "update a b c", "a b c", true},
			{0, "fail b", "a c", true},
			{1, "fail c", "a", true},
			{12, "next", "10", false}, // due: asking does not apply it
			{12, "black", "", false},  // nor does listing the blacklist
			{12, "next", "10", false},
			{12, "advance", "a b c", true},
			{12, "next", "none", false},
		}},
		{"leaving", hosts.Config{}, []step{
			{0, "update a b c", "a b c", true},
			{1, "leave b", "a c", true},
			{1, "leave b", "a c", false},
			{2, "update a b c", "a c", false},
			{3, "update a c", "a c", false},
			{4, "update a b c", "a c", false},
			{5, "clear b", "a c b", true},
			{6, "clear b", "a c b", false},
		}},
		{"leaving before discovery lists the host", hosts.Config{}, []step{
			{0, "leave d", "", false},
			{1, "update a d", "a", true},
			{2, "clear d", "a d", true},
		}},
		{"leaving while cooling down, cleared before the cooldown ends", hosts.Config{}, []step{
			{0, "update a b", "a b", true},
			{0, "fail a", "b", true},
			{1, "leave a", "b", false},
			{1, "next", "none", false},
			{5, "clear a", "b", false},
			{5, "next", "10", false},
			{10, "look", "b a", false},
		}},
		{"leaving while cooling down, cleared after the cooldown ends", hosts.Config{}, []step{
			{0, "update a b", "a b", true},
			{0, "fail a", "b", true},
			{1, "leave a", "b", false},
			{20, "look", "b", false},
			{20, "clear a", "b a", true},
		}},
		{"clearing a host discovery no longer lists", hosts.Config{}, []step{
			{0, "update a b", "a b", true},
			{0, "leave b", "a", true},
			{1, "update a", "a", false},
			{2, "clear b", "a", false},
			{3, "update a b", "a b", true},
		}},
		{"time going back counts as the latest time", hosts.Config{}, []step{
			{0, "update a b c", "a b c", true},
			{10, "fail b", "a c", true},
			{5, "next", "20", false},
			{5, "black", "b:1@20", false},
			{5, "look", "a c", false},
			{20, "look", "a c b", false},
		}},
		{"custom range", hosts.Config{CooldownMin: 2 * time.Second, CooldownMax: 5 * time.Second}, []step{
			{0, "update a", "a", true},
			{0, "fail a", "", true},
			{2, "fail a", "", false},
			{6, "fail a", "", false},
			{6, "black", "a:3@11", false}, // 2, 4, then 8 capped at 5
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := hosts.New(tt.cfg)
			for i, s := range tt.steps {
				verb, arg, _ := strings.Cut(s.do, " ")
				now := at(s.at)
				var changed bool
				switch verb {
				case "update":
					changed = m.Update(now, parseHosts(t, arg))
				case "fail":
					changed = m.Blacklist(now, arg)
				case "leave":
					changed = m.SetLeaving(arg)
				case "clear":
					changed = m.ClearLeaving(arg)
				case "advance":
					changed = m.Advance(now)
				case "look":
				case "next":
					got := "none"
					if n := m.NextEvent(); !n.IsZero() {
						got = strconv.Itoa(int(n.Sub(t0) / time.Second))
					}
					if got != s.want {
						t.Fatalf("step %d (t=%d %q): NextEvent %s; want %s", i, s.at, s.do, got, s.want)
					}
					continue
				case "black":
					var got []string
					for _, e := range m.Blacklisted(now) {
						got = append(got, fmt.Sprintf("%s:%d@%d", e.ID, e.Failures, e.Until.Sub(t0)/time.Second))
					}
					if g := strings.Join(got, " "); g != s.want {
						t.Fatalf("step %d (t=%d %q): Blacklisted %q; want %q", i, s.at, s.do, g, s.want)
					}
					continue
				default:
					t.Fatalf("bad verb %q", verb)
				}
				if verb != "look" && changed != s.changed {
					t.Fatalf("step %d (t=%d %q): returned %v; want %v", i, s.at, s.do, changed, s.changed)
				}
				if s.want == "?" {
					continue
				}
				if got := ids(m.Usable(now)); got != s.want {
					t.Fatalf("step %d (t=%d %q): Usable %q; want %q", i, s.at, s.do, got, s.want)
				}
			}
		})
	}
}

func TestManagerUsableReturnsLatestHost(t *testing.T) {
	m := hosts.New(hosts.Config{})
	m.Update(t0, []providers.Host{{ID: "a", Addr: "a", Slots: 1, Zone: "z1"}})
	if changed := m.Update(at(1), []providers.Host{{ID: "a", Addr: "a", Slots: 1, Zone: "z2", Type: "g5", Spot: true}}); changed {
		t.Error("a change of zone, type or lifecycle alone was reported as an assignment change")
	}
	got := m.Usable(at(1))
	if len(got) != 1 || got[0].Zone != "z2" || got[0].Type != "g5" || !got[0].Spot {
		t.Errorf("Usable %+v; want the host as last discovered", got)
	}
	got[0].ID = "changed by the caller"
	if again := m.Usable(at(1)); again[0].ID != "a" {
		t.Errorf("the caller's change to Usable's result reached the manager: %+v", again)
	}
}

// A quarantined host stays out whatever discovery says and however its cooldown runs, even
// if it leaves discovery and comes back; Release brings it back at once, its failures
// forgotten.
func TestQuarantine(t *testing.T) {
	m := hosts.New(hosts.Config{CooldownMin: 10 * time.Second})
	m.Update(t0, parseHosts(t, "a b c"))
	m.Usable(at(1))
	m.Blacklist(at(1), "b")
	if m.Quarantine("b") {
		t.Error("quarantine of a host already cooling down reported a change")
	}
	if got := ids(m.Usable(at(60))); got != "a c" {
		t.Fatalf("after the cooldown: %q, want b kept out", got)
	}
	m.Update(at(61), parseHosts(t, "a c"))
	m.Update(at(62), parseHosts(t, "a b c"))
	if got := ids(m.Usable(at(62))); got != "a c" || !slices.Equal(m.Quarantined(), []string{"b"}) || !m.NextEvent().IsZero() {
		t.Fatalf("after b left and came back: %q, quarantined %v", got, m.Quarantined())
	}
	if m.Release("a") {
		t.Error("released a host that was not quarantined")
	}
	if !m.Release("b") || len(m.Quarantined()) != 0 {
		t.Fatal("release failed")
	}
	if got := ids(m.Usable(at(62))); got != "a c b" {
		t.Fatalf("after release: %q, want b back at the end", got)
	}
	m.Blacklist(at(63), "b")
	if bl := m.Blacklisted(at(63)); len(bl) != 1 || bl[0].Failures != 1 {
		t.Fatalf("blacklist after release %+v: want the failures forgotten (1, not 2)", bl)
	}
}

// TestCooldownGrowth: 1×, 2×, 4× … CooldownMin, capped at CooldownMax.
func TestCooldownGrowth(t *testing.T) {
	tests := []struct {
		cfg  hosts.Config
		want []time.Duration
	}{
		{hosts.Config{}, []time.Duration{10, 20, 40, 80, 160, 300, 300, 300}},
		{hosts.Config{CooldownMin: time.Second, CooldownMax: 3 * time.Second}, []time.Duration{1, 2, 3, 3}},
		{hosts.Config{CooldownMin: 7 * time.Second, CooldownMax: 7 * time.Second}, []time.Duration{7, 7, 7}},
		{hosts.Config{CooldownMin: time.Second, CooldownMax: time.Hour}, []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3600, 3600}},
	}
	for _, tt := range tests {
		// Decay is set far away, so only growth shows.
		tt.cfg.DecayAfter = 100 * time.Hour
		m := hosts.New(tt.cfg)
		now := t0
		m.Update(now, parseHosts(t, "a"))
		for i, want := range tt.want {
			want *= time.Second
			m.Blacklist(now, "a")
			bl := m.Blacklisted(now)
			if len(bl) != 1 || bl[0].Failures != i+1 || bl[0].Until.Sub(now) != want {
				t.Fatalf("%+v, failure %d: Blacklisted %+v; want %d failures and a cooldown of %v", tt.cfg, i+1, bl, i+1, want)
			}
			now = bl[0].Until
		}
	}
	// Many failures cannot overflow the doubling.
	m := hosts.New(hosts.Config{CooldownMin: time.Nanosecond, CooldownMax: time.Hour, DecayAfter: 1000 * time.Hour})
	now := t0
	for range 200 {
		m.Blacklist(now, "a")
		now = now.Add(time.Hour)
	}
	if bl := m.Blacklisted(now.Add(-time.Hour)); len(bl) != 1 || bl[0].Failures != 200 || bl[0].Until != now {
		t.Fatalf("after 200 failures: %+v", bl)
	}
}

// TestDecay: the failure count halves for every DecayAfter without a failure after the
// cooldown ended.
func TestDecay(t *testing.T) {
	const decay = 600
	tests := []struct {
		gap      int // seconds after the third cooldown ended (failure at 120 s + 40 s)
		failures int // the count then, before the next failure
		next     time.Duration
	}{
		{0, 3, 80},
		{decay - 1, 3, 80},
		{decay, 1, 20},
		{2*decay - 1, 1, 20},
		{2 * decay, 0, 10},
		{100 * decay, 0, 10},
	}
	for _, tt := range tests {
		m := hosts.New(hosts.Config{DecayAfter: decay * time.Second})
		m.Update(t0, parseHosts(t, "a b"))
		m.Blacklist(at(0), "a")   // 1: 10 s
		m.Blacklist(at(60), "a")  // 2: 20 s
		m.Blacklist(at(120), "a") // 3: 40 s, until 160 s
		now := at(160 + tt.gap)
		m.Blacklist(now, "a")
		bl := m.Blacklisted(now)
		if len(bl) != 1 || bl[0].Failures != tt.failures+1 || bl[0].Until.Sub(now) != tt.next*time.Second {
			t.Errorf("gap %ds: Blacklisted %+v; want %d failures and a cooldown of %ds", tt.gap, bl, tt.failures+1, tt.next)
		}
	}

	// A cooldown longer than DecayAfter: nothing decays while the host cools down.
	m := hosts.New(hosts.Config{CooldownMin: 30 * time.Minute, CooldownMax: time.Hour, DecayAfter: 10 * time.Minute})
	m.Update(t0, parseHosts(t, "a"))
	m.Blacklist(t0, "a")
	m.Blacklist(t0.Add(30*time.Minute), "a") // 2 failures: 1h, until 1h30m
	if bl := m.Blacklisted(t0.Add(89 * time.Minute)); len(bl) != 1 || bl[0].Failures != 2 || !bl[0].Until.Equal(t0.Add(90*time.Minute)) {
		t.Errorf("at the end of a long cooldown: Blacklisted %+v; want 2 failures until 1h30m", bl)
	}
	m.Blacklist(t0.Add(100*time.Minute), "a") // 10 minutes after: 2 halves to 1, then 2 again
	if bl := m.Blacklisted(t0.Add(100 * time.Minute)); len(bl) != 1 || bl[0].Failures != 2 || !bl[0].Until.Equal(t0.Add(160*time.Minute)) {
		t.Errorf("after one halving: Blacklisted %+v; want 2 failures until 2h40m", bl)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  hosts.Config
		want string // "" = valid
	}{
		{hosts.Config{}, ""},
		{hosts.Config{CooldownMin: time.Second, CooldownMax: time.Second}, ""},
		{hosts.Config{CooldownMin: time.Nanosecond, CooldownMax: time.Hour, DecayAfter: time.Nanosecond}, ""},
		{hosts.Config{CooldownMin: time.Minute}, ""},
		{hosts.Config{CooldownMax: time.Hour}, ""},
		{hosts.Config{CooldownMin: -time.Second}, "minimum -1s: must be positive"},
		{hosts.Config{CooldownMax: -time.Second}, "maximum -1s: must be positive"},
		{hosts.Config{DecayAfter: -time.Second}, "decay interval -1s: must be positive"},
		{hosts.Config{CooldownMin: 20 * time.Second, CooldownMax: 10 * time.Second}, "range 20s to 10s: the minimum is above the maximum"},
		{hosts.Config{CooldownMin: 10 * time.Minute}, ""}, // the maximum defaults to at least the minimum
		{hosts.Config{CooldownMin: 2 * time.Hour}, "maximum 2h0m0s: must be at most 1h0m0s"},
		{hosts.Config{CooldownMin: 10 * time.Minute, CooldownMax: time.Minute}, "range 10m0s to 1m0s"},
		{hosts.Config{CooldownMax: 2 * time.Hour}, "maximum 2h0m0s: must be at most 1h0m0s"},
		{hosts.Config{CooldownMin: time.Second, CooldownMax: time.Hour + 1}, "must be at most 1h0m0s"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: %v", tt.cfg, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%+v: error %v; want one containing %q", tt.cfg, err, tt.want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("New with an invalid Config did not panic")
		}
	}()
	hosts.New(hosts.Config{CooldownMin: -1})
}

// TestManagerRandomized runs random sequences of calls and checks the invariants that every
// scenario above relies on:
//   - Usable is exactly the listed hosts, minus those leaving, minus those in Blacklisted;
//   - between two looks, the hosts in both keep their relative order and come first: the
//     new order is the old one with hosts removed, then hosts appended;
//   - the result does not depend on the order in which discovery lists hosts;
//   - each call's result says whether the assignment differs from the one last seen.
func TestManagerRandomized(t *testing.T) {
	for seed := range uint64(100) {
		rng := rand.New(rand.NewPCG(seed, 1))
		cfg := hosts.Config{CooldownMin: 2 * time.Second, CooldownMax: 20 * time.Second, DecayAfter: 60 * time.Second}
		a, b := hosts.New(cfg), hosts.New(cfg) // b sees every discovery result shuffled
		universe := make([]providers.Host, 8)
		for i := range universe {
			id := fmt.Sprintf("h%d", i)
			universe[i] = providers.Host{ID: id, Addr: id, Slots: 1 + rng.IntN(2), Launched: at(rng.IntN(3))}
		}
		var listed []providers.Host
		leaving := map[string]bool{}
		var prev []providers.Host
		now := t0
		// Usable is not asked after every change, as the driver does not ask it after every
		// event: the manager's changes then pile up unread (SetLeaving's slow path).
		changedUnread, unread, vague := false, 0, false
		stayed := map[string]bool{} // usable at every step since Usable was last asked
		quarantined := map[string]bool{}
		for step := range 300 {
			op := rng.IntN(12)
			if op < 7 || op == 9 {
				// SetLeaving and ClearLeaving take no time: they act at the latest time seen.
				now = now.Add(time.Duration(rng.IntN(4000)) * time.Millisecond)
			}
			var ca, cb bool
			var what string
			switch {
			case op < 4:
				listed = listed[:0]
				for _, h := range universe {
					if rng.IntN(4) > 0 {
						if rng.IntN(10) == 0 {
							h.Slots = 1 + rng.IntN(3)
						}
						listed = append(listed, h)
					}
				}
				shuffled := slices.Clone(listed)
				rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				what = "update " + ids(listed)
				ca, cb = a.Update(now, listed), b.Update(now, shuffled)
			case op < 7:
				id := universe[rng.IntN(len(universe))].ID
				what = "fail " + id
				ca, cb = a.Blacklist(now, id), b.Blacklist(now, id)
			case op < 8:
				id := universe[rng.IntN(len(universe))].ID
				what = "leave " + id
				leaving[id] = true
				ca, cb = a.SetLeaving(id), b.SetLeaving(id)
			case op < 9:
				id := universe[rng.IntN(len(universe))].ID
				what = "clear " + id
				delete(leaving, id)
				ca, cb = a.ClearLeaving(id), b.ClearLeaving(id)
			case op == 10:
				id := universe[rng.IntN(len(universe))].ID
				what = "quarantine " + id
				quarantined[id] = true
				ca, cb = a.Quarantine(id), b.Quarantine(id)
			case op == 11:
				// Release says whether the host was held, not whether Usable changed: the
				// hosts' change is not checked until Usable is asked again.
				id := universe[rng.IntN(len(universe))].ID
				if held := slices.Sorted(maps.Keys(quarantined)); len(held) > 0 {
					id = held[rng.IntN(len(held))]
				}
				what = "release " + id
				delete(quarantined, id)
				ca, cb = a.Release(id), b.Release(id)
				vague = true
			default:
				what = "advance"
				if na, nb := a.NextEvent(), b.NextEvent(); !na.Equal(nb) {
					t.Fatalf("seed %d step %d: NextEvent %v and %v at %v", seed, step, na, nb, now)
				}
				ca, cb = a.Advance(now), b.Advance(now)
				// Advance applied whatever was due: what is left is still to come.
				if na := a.NextEvent(); !na.IsZero() && !na.After(now) {
					t.Fatalf("seed %d step %d: NextEvent %v after Advance at %v", seed, step, na, now)
				}
			}
			where := fmt.Sprintf("seed %d step %d (%s at +%v)", seed, step, what, now.Sub(t0))
			if ca != cb {
				t.Fatalf("%s: shuffled discovery returned %v; in order %v", where, cb, ca)
			}
			changedUnread, unread = changedUnread || ca, unread+1
			// Membership, as the test has it: listed, not leaving, not cooling down, not quarantined.
			cooling := map[string]bool{}
			for _, e := range a.Blacklisted(now) {
				cooling[e.ID] = true
			}
			var want []string
			for _, h := range listed {
				if !leaving[h.ID] && !cooling[h.ID] && !quarantined[h.ID] {
					want = append(want, h.ID)
				}
			}
			for id := range stayed {
				if !slices.Contains(want, id) {
					delete(stayed, id)
				}
			}
			if op != 9 && rng.IntN(3) == 0 {
				continue
			}
			ua, ub := a.Usable(now), b.Usable(now)
			if !slices.Equal(ua, ub) {
				t.Fatalf("%s: shuffled discovery gave %q; in order %q", where, ids(ub), ids(ua))
			}
			// One change since Usable was last asked: it says whether the hosts changed. More:
			// they may have changed and changed back, but none went unsaid.
			if same := sameAssignment(prev, ua); !vague && ((unread == 1 && changedUnread == same) || (!changedUnread && !same)) {
				t.Fatalf("%s: %d changes since Usable was asked returned %v, but Usable went from %q to %q", where, unread, changedUnread, ids(prev), ids(ua))
			}
			changedUnread, unread, vague = false, 0, false
			got := strings.Fields(ids(ua))
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("%s: Usable holds %v; listed, not leaving, not cooling down, not quarantined: %v", where, got, want)
			}
			// Order: survivors first, in their old relative order. A host that left and came
			// back since Usable was last asked is no survivor: it comes back at the end.
			inNew := map[string]bool{}
			for _, h := range ua {
				inNew[h.ID] = true
			}
			var survivors []string
			for _, h := range prev {
				if inNew[h.ID] && stayed[h.ID] {
					survivors = append(survivors, h.ID)
				}
			}
			if head := strings.Fields(ids(ua))[:len(survivors)]; !slices.Equal(head, survivors) {
				t.Fatalf("%s: order went from %q to %q; survivors %q must keep their order and come first", where, ids(prev), ids(ua), survivors)
			}
			prev = ua
			clear(stayed)
			for id := range inNew {
				stayed[id] = true
			}
		}
	}
}

func sameAssignment(a, b []providers.Host) bool {
	return slices.EqualFunc(a, b, func(x, y providers.Host) bool {
		return x.ID == y.ID && x.Addr == y.Addr && x.Slots == y.Slots
	})
}

// SetLeaving of several hosts at once (a notice marks every slot of its host), whether or not
// the assignment last reported is still the order's; and NextEvent, which the manager keeps
// between calls, follows every call that changes it.
func TestSetLeavingAndNextEvent(t *testing.T) {
	m := hosts.New(hosts.Config{CooldownMin: 10 * time.Second, CooldownMax: 10 * time.Second})
	if !m.Update(at(0), parseHosts(t, "a b c d")) {
		t.Fatal("first discovery: no change")
	}
	if !m.Quarantine("b") {
		t.Fatal("quarantine b: no change")
	}
	// Release puts b back without reporting it: the last reported assignment is a c d.
	m.Release("b")
	if m.SetLeaving("b") {
		t.Error("b leaving after its release, unreported: reported as a change of a c d")
	}
	if !m.SetLeaving("a", "c") {
		t.Error("a and c leaving: no change")
	}
	if got := ids(m.Usable(at(0))); got != "d" {
		t.Errorf("usable %q, want d", got)
	}
	if m.SetLeaving("a", "c") {
		t.Error("a and c leaving again: a change")
	}

	m.Blacklist(at(1), "d")
	if got := m.NextEvent(); !got.Equal(at(11)) {
		t.Errorf("NextEvent %v after d's blacklisting, want +11s", got)
	}
	m.SetLeaving("d")
	// Kept as it was (a leaving host only takes an event away): a wake-up for nothing.
	if got := m.NextEvent(); !got.IsZero() && !got.Equal(at(11)) {
		t.Errorf("NextEvent %v once d is leaving, want none or the time kept, +11s", got)
	}
	if m.Advance(at(11)) {
		t.Error("Advance at the end of a leaving host's cooldown: a change")
	}
	if got := m.NextEvent(); !got.IsZero() {
		t.Errorf("NextEvent %v after that Advance, want none", got)
	}
	m.ClearLeaving("d")
	if got := ids(m.Usable(at(11))); got != "d" {
		t.Errorf("usable %q once d stays again after its cooldown, want d", got)
	}
	m.Blacklist(at(12), "d")
	m.Quarantine("d")
	m.Release("d")
	if got := m.NextEvent(); !got.IsZero() {
		t.Errorf("NextEvent %v after d's release (cooldown forgotten), want none", got)
	}
}
