package bench_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/elasticd/elasticd/bench"
)

func TestNoticeJSON(t *testing.T) {
	var out, stderr bytes.Buffer
	_, err := bench.Notice(bounded(t), bench.NoticeOptions{Exe: binary, Trainer: trainer, Runs: 1, JSON: true, Out: &out, Err: &stderr})
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	var r map[string]float64
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%q: %v", out.String(), err)
	}
	for _, k := range []string{"detect_s", "move_s", "total_s"} {
		if !(r[k] > 0 && r[k] < 30) {
			t.Errorf("%s = %v, want within (0, 30) s: well inside a 30 s warning", k, r[k])
		}
	}
	if r["steps_lost"] != 0 {
		t.Errorf("steps_lost = %v, want 0: a notice moves the job without rollback", r["steps_lost"])
	}
	if r["runs"] != 1 || r["total_s"] < r["detect_s"] {
		t.Errorf("runs/total: %v", r)
	}
}
