package bench_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/elasticd/elasticd/bench"
)

// Recovery measures a real job: cold start, recovery and join are positive and bounded,
// and no committed step is lost.
func TestRecoveryJSON(t *testing.T) {
	var out, stderr bytes.Buffer
	_, err := bench.Recovery(bounded(t), bench.RecoveryOptions{Exe: binary, Trainer: trainer, NP: 3, Runs: 1, Fault: "kill",
		CommTimeout: time.Second, JSON: true, Out: &out, Err: &stderr})
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	var r map[string]float64
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%q: %v", out.String(), err)
	}
	for _, k := range []string{"cold_start_s", "recovery_s", "join_s"} {
		if !(r[k] > 0 && r[k] < 30) {
			t.Errorf("%s = %v, want within (0, 30) s", k, r[k])
		}
	}
	if r["steps_lost"] < 0 || r["steps_lost"] > 1 {
		t.Errorf("steps_lost = %v, want 0 or 1 (at most the step in progress)", r["steps_lost"])
	}
	if r["np"] != 3 || r["runs"] != 1 {
		t.Errorf("np/runs: %v", r)
	}
}
