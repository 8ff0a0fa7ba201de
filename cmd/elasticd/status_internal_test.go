package main

import (
	"strings"
	"testing"

	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/driver/cost"
)

// A job with no price for any of its instance time says so, not "0 USD", and how to get prices;
// a priced one gives its totals, with "on-demand" in one sense per phrase.
func TestCostLine(t *testing.T) {
	price := 0.5
	for _, tc := range []struct {
		name      string
		sum       cost.Summary
		want, not []string
	}{
		{
			name: "unpriced",
			sum:  cost.Summary{Currency: "USD", Lines: []cost.Line{{Lifecycle: "on-demand", Type: "local", Seconds: 7200}}, Unpriced: []string{"local (on-demand)"}},
			want: []string{"cost: unpriced, 2.00 instance-hours with no price (local (on-demand))", "give --prices FILE", "rollbacks threw away 3 steps"},
			not:  []string{"0.0000", "USD"},
		},
		{
			// A job that never had a host (its first poll failed) has nothing to price,
			// which is not the same as time without a price.
			name: "no hosts",
			sum:  cost.Summary{Currency: "USD", Lines: []cost.Line{}, Unpriced: []string{}},
			want: []string{"cost: nothing to price: no host was in the job"},
			not:  []string{"()", "no price", "USD"},
		},
		{
			name: "priced",
			sum: cost.Summary{Currency: "USD", Total: 1, Spot: 1, OnDemandEquivalent: 2.5, Savings: 1.5, SavingsPercent: 60,
				Lines: []cost.Line{{Lifecycle: "spot", Type: "g5.xlarge", Seconds: 7200, Cost: &price}}, Unpriced: []string{}},
			want: []string{"cost 1.00 USD for 2.00 instance-hours (1.00 USD on spot instances, 0.0000 USD on on-demand instances)", "saved 1.50 USD (60%) against 2.50 USD for the same hours at on-demand prices", "rollbacks threw away 3 steps, "},
			not:  []string{"unpriced", "no price"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &driver.Status{Cost: &tc.sum}
			s.Progress.RolledBackSteps = 3
			line := costLine(s)
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("%q\ndoes not contain %q", line, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(line, n) {
					t.Errorf("%q\ncontains %q", line, n)
				}
			}
		})
	}
}

// The progress line gives step X of N, the time to go and the loss where the program reports
// them, and leaves them out where it does not.
func TestPrintJobStatusProgress(t *testing.T) {
	s := &driver.Status{JobID: "j", Phase: "running", Mode: "in-process"}
	s.Progress = driver.ProgressStatus{Step: 400, CommittedStep: 390, StepsPerSecond: 50, TotalSteps: 1000, ETASeconds: new(12.0), Loss: new(0.123456)}
	var b strings.Builder
	printJobStatus(&b, s, 0)
	if want := "progress: step 400 of 1000, committed 390, 50.0 steps/s, 12s to go; loss 0.1235; rolled back 0 steps\n"; !strings.Contains(b.String(), want) {
		t.Errorf("status:\n%s\nwant the line %q", b.String(), want)
	}
	s.Progress = driver.ProgressStatus{Step: 400, CommittedStep: 390}
	b.Reset()
	printJobStatus(&b, s, 0)
	if want := "progress: step 400, committed 390, not stepping; rolled back 0 steps\n"; !strings.Contains(b.String(), want) {
		t.Errorf("status:\n%s\nwant the line %q", b.String(), want)
	}
}
