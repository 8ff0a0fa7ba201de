package main_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkSimFallback measures --manage-capacity on the simulated cloud (make
// bench-capacity; docs/benchmarks.md "Steering the fleet"): one job per iteration, the
// demo-cloud sequence with shorter waits. Spot runs short at 3 s (one of two spot hosts
// reclaimed after a 3 s notice), the fallback waits 4 s, spot returns at 25 s. Reported, per
// job, from the driver's log:
//
//   - end-to-zero-ms: the job's end ("job finished") to the spot group's desired size at zero
//     acknowledged by the cloud (goal: under one discovery poll, 1 s, plus the call);
//   - fallback-to-np-s: the fallback group ordered to the job back at -np on it, less the
//     instance's boot (1 s on this cloud) (goal: at most 5 s);
//   - steps-lost: committed steps missing or repeated across the whole job (goal: 0);
//   - od-hours/least: the on-demand instance's time (launch to termination) over the least it
//     could have been (ordered until the job moved back to spot).
func BenchmarkSimFallback(b *testing.B) {
	var endToZero, toNP, lost, odRatio []float64
	for range b.N {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		scenario := b.TempDir() + "/scenario"
		writeFile(b, scenario, "3s spot-capacity 1\n25s spot-capacity unlimited\n")
		cmd := exec.CommandContext(ctx, binary, "run", "--provider", "sim", "-np", "4", "--min-np", "2", "--slots-per-host", "2",
			"--manage-capacity", "--sim-fallback", "--fallback-after", "4s", "--sim-interrupt-warning", "3s", "--sim-scenario", scenario,
			"--", trainer, "--log-every", "1000", "--steps", "6000", "--step-delay", "5ms", "--events")
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			b.Fatalf("job: %v\n%s", err, out)
		}
		log := string(out)
		at := func(pattern string) time.Time {
			b.Helper()
			m := regexp.MustCompile(`time=(\d\d:\d\d:\d\d\.\d\d\d) level=\w+ msg="?` + pattern).FindStringSubmatch(log)
			if m == nil {
				b.Fatalf("no log line %q in:\n%s", pattern, log)
			}
			t, err := time.Parse("15:04:05.000", m[1])
			if err != nil {
				b.Fatal(err)
			}
			return t
		}
		finished := at(`job finished`)
		zero := at(`group scaled down for the job's end" group="sim group spot"`)
		ordered := at(`setting the group's desired size" group="sim group ondemand" from=0 to=1`)
		odLaunched := at(`sim: launching an instance" provider=sim group=ondemand`)
		backAt := regexp.MustCompile(`time=(\d\d:\d\d:\d\d\.\d\d\d) level=INFO msg="generation started" generation=\d+ world_size=4`).FindAllStringSubmatch(log, -1)
		var atNP time.Time
		for _, m := range backAt {
			if t, _ := time.Parse("15:04:05.000", m[1]); t.After(ordered) {
				atNP = t
				break
			}
		}
		if atNP.IsZero() {
			b.Fatalf("the job never came back to -np after the fallback was ordered:\n%s", log)
		}
		movedBack := at(`spot capacity is back: moving off the on-demand fallback hosts`)
		odGone := at(`sim: instance terminated" provider=sim group=ondemand`)
		endToZero = append(endToZero, float64(zero.Sub(finished).Microseconds())/1000)
		toNP = append(toNP, atNP.Sub(ordered).Seconds()-1)
		odRatio = append(odRatio, odGone.Sub(odLaunched).Seconds()/movedBack.Sub(ordered).Seconds())
		s := steps(log)
		missing := 0
		for i := 1; i < len(s); i++ {
			if s[i] != s[i-1]+1 {
				missing++
			}
		}
		if len(s) == 0 || s[len(s)-1] != 6000 {
			missing++
		}
		lost = append(lost, float64(missing))
		if !strings.Contains(log, "rollbacks threw away 0 steps") {
			b.Errorf("a rollback:\n%s", log[max(0, len(log)-2000):])
		}
	}
	b.ReportMetric(median(endToZero), "end-to-zero-ms")
	b.ReportMetric(median(toNP), "fallback-to-np-s")
	b.ReportMetric(median(lost), "steps-lost")
	b.ReportMetric(median(odRatio), "od-hours/least")
	b.ReportMetric(0, "ns/op") // one job takes what its scenario takes: not a figure
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func writeFile(b *testing.B, path, text string) {
	b.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		b.Fatal(err)
	}
}
