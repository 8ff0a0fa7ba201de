package aws_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers/aws"
)

const (
	linux    = "Linux/UNIX"
	linuxVPC = "Linux/UNIX (Amazon VPC)"
)

// at is a time of the price history: n hours after a fixed morning.
func at(n int) time.Time {
	return time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC).Add(time.Duration(n) * time.Hour)
}

func samePrices(t *testing.T, got, want map[string]map[string]float64) {
	t.Helper()
	if !maps.EqualFunc(got, want, func(a, b map[string]float64) bool { return maps.Equal(a, b) }) {
		t.Errorf("prices:\n got  %v\n want %v", got, want)
	}
}

// TestSpotPrices: one call pages through the history, keeps the newest entry of each type and
// zone whatever the order, leaves out what was not asked for, has no price or a price that is
// not positive, and asks for the types deduplicated and sorted, both Linux product
// descriptions and the price in effect now.
func TestSpotPrices(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.change(func() {
		f.pricePage = 3
		f.prices = []fakePrice{
			{"p5.48xlarge", "us-east-1a", linux, "31.464000", at(0)},
			{"p5.48xlarge", "us-east-1b", linux, "29.100000", at(-3)}, // older: the next one wins
			{"p5.48xlarge", "us-east-1b", linux, "30.250000", at(-1)},
			{"p5.48xlarge", "us-east-1a", linux, "40.000000", at(-2)}, // older, on a later page
			{"p5.48xlarge", "us-east-1c", linuxVPC, "28.000000", at(0)},
			{"g5.xlarge", "us-east-1a", linux, "0.123400", at(0)},
			{"g5.xlarge", "us-east-1a", linuxVPC, "0.130000", at(0)}, // a tie: the higher price
			{"g5.xlarge", "us-east-1d", linux, "0.000000", at(0)},    // not positive: left out
			{"g5.xlarge", "us-east-1f", linux, "0.110000", at(-1)},
			{"g5.xlarge", "us-east-1f", linux, "-1", at(0)}, // the newest is not positive
			{"c7i.large", "us-east-1a", linux, "0.050000", at(0)},
			{"p5.48xlarge", "us-east-1a", "Windows", "50.000000", at(1)}, // not Linux
		}
	})
	p := newProvider(t, f, aws.Config{})
	before := time.Now()
	got, err := p.SpotPrices(pollCtx(t), []string{"p5.48xlarge", "g5.xlarge", "p5.48xlarge", "p4d.24xlarge", "c7i.large", "g5.xlarge"})
	after := time.Now()
	if err != nil {
		t.Fatalf("SpotPrices: %v", err)
	}
	samePrices(t, got, map[string]map[string]float64{
		"p5.48xlarge": {"us-east-1a": 31.464, "us-east-1b": 30.25, "us-east-1c": 28},
		"g5.xlarge":   {"us-east-1a": 0.13},
		"c7i.large":   {"us-east-1a": 0.05},
	})

	// 11 Linux entries of the asked types, 3 a page: 4 pages.
	f.mu.Lock()
	inputs := f.inputs["DescribeSpotPriceHistory"]
	f.mu.Unlock()
	if len(inputs) != 4 {
		t.Fatalf("%d calls; want 4 (11 entries, 3 a page)", len(inputs))
	}
	for i, in := range inputs {
		wantToken := ""
		if i > 0 {
			wantToken = fmt.Sprintf("offset-%d", 3*i)
		}
		for k, want := range map[string]string{
			"Version":        "2016-11-15",
			"InstanceType.1": "c7i.large", "InstanceType.2": "g5.xlarge", "InstanceType.3": "p4d.24xlarge",
			"InstanceType.4": "p5.48xlarge", "InstanceType.5": "",
			"ProductDescription.1": linux, "ProductDescription.2": linuxVPC, "ProductDescription.3": "",
			"MaxResults": "1000", "NextToken": wantToken,
		} {
			if got := in.Get(k); got != want {
				t.Errorf("call %d: %s=%q; want %q", i+1, k, got, want)
			}
		}
		start, err := time.Parse(time.RFC3339, in.Get("StartTime"))
		if err != nil {
			t.Errorf("call %d: StartTime %q: %v", i+1, in.Get("StartTime"), err)
		} else if start.Before(before.Add(-time.Second)) || start.After(after.Add(time.Second)) {
			t.Errorf("call %d: StartTime %v; want now (%v to %v)", i+1, start, before, after)
		}
		if unknown := unknownParams(in, "Action", "Version", "InstanceType.", "ProductDescription.", "StartTime", "MaxResults", "NextToken"); unknown != nil {
			t.Errorf("call %d: unexpected parameters %v", i+1, unknown)
		}
	}
}

// unknownParams lists the form's keys that are none of known (a key ending in "." is a prefix).
func unknownParams(form url.Values, known ...string) []string {
	var out []string
	for k := range form {
		ok := false
		for _, kn := range known {
			if k == kn || strings.HasSuffix(kn, ".") && strings.HasPrefix(k, kn) {
				ok = true
			}
		}
		if !ok {
			out = append(out, k)
		}
	}
	return out
}

// TestSpotPricesNoTypes: nothing asked, nothing called, an empty map.
func TestSpotPricesNoTypes(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.change(func() { f.prices = []fakePrice{{"g5.xlarge", "us-east-1a", linux, "0.1234", at(0)}} })
	p := newProvider(t, f, aws.Config{})
	for _, types := range [][]string{nil, {}, {""}, {"", ""}} {
		got, err := p.SpotPrices(pollCtx(t), types)
		if err != nil || got == nil || len(got) != 0 {
			t.Errorf("SpotPrices(%q): %v, %v; want an empty map", types, got, err)
		}
	}
	if n := f.count("DescribeSpotPriceHistory"); n != 0 {
		t.Errorf("%d calls; want none", n)
	}
}

// TestSpotPricesErrors: answers that cannot be used, and a missing permission, fail the call
// at once with what is wrong; a throttle is waited out and tried again.
func TestSpotPricesErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		prices []fakePrice
		flt    *fault // answered to every call
		want   []string
		calls  int
	}{
		{name: "MalformedPrice", prices: []fakePrice{
			{"g5.xlarge", "us-east-1a", linux, "0.1234", at(0)},
			{"g5.xlarge", "us-east-1b", linux, "0.12.34", at(0)},
		}, want: []string{"spot prices in us-east-1", "g5.xlarge in us-east-1b", `"0.12.34"`}, calls: 1},
		{name: "NotAPrice", prices: []fakePrice{{"p5.48xlarge", "us-east-1c", linux, "NaN", at(0)}},
			want: []string{"p5.48xlarge in us-east-1c", `"NaN"`}, calls: 1},
		{name: "Unauthorized", flt: &fault{status: 403, code: "UnauthorizedOperation", msg: "You are not authorized to perform this operation."},
			want: []string{"spot prices in us-east-1", "UnauthorizedOperation", "may not call ec2:DescribeSpotPriceHistory", "IAM role"}, calls: 1},
		{name: "RepeatedPageToken", flt: &fault{file: "spot_price_repeated_token.xml"},
			want: []string{"repeated page token"}, calls: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t)
			f.change(func() { f.prices = c.prices })
			if c.flt != nil {
				f.failAlways("DescribeSpotPriceHistory", *c.flt)
			}
			start := time.Now()
			got, err := newProvider(t, f, aws.Config{}).SpotPrices(pollCtx(t), []string{"g5.xlarge", "p5.48xlarge"})
			if err == nil || got != nil {
				t.Fatalf("SpotPrices: %v, %v; want an error and no prices", got, err)
			}
			if !containsAll(err.Error(), c.want...) {
				t.Errorf("error %q\nwant it to contain %q", err, c.want)
			}
			if n := f.count("DescribeSpotPriceHistory"); n != c.calls {
				t.Errorf("%d calls; want %d", n, c.calls)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("took %v: an error a retry cannot fix must not be retried", took)
			}
			t.Logf("the error reads: %v", err)
		})
	}
}

// TestSpotPricesThrottled: RequestLimitExceeded is waited out (as long as the server asks) and
// the call tried again.
func TestSpotPricesThrottled(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.change(func() { f.prices = []fakePrice{{"g5.xlarge", "us-east-1a", linux, "0.1234", at(0)}} })
	f.fail("DescribeSpotPriceHistory", fault{status: 503, code: "RequestLimitExceeded", msg: "Request limit exceeded.", retryAfter: "0.3"})
	p := newProvider(t, f, aws.Config{})
	start := time.Now()
	got, err := p.SpotPrices(pollCtx(t), []string{"g5.xlarge"})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("SpotPrices after a throttle: %v", err)
	}
	samePrices(t, got, map[string]map[string]float64{"g5.xlarge": {"us-east-1a": 0.1234}})
	if n := f.count("DescribeSpotPriceHistory"); n != 2 {
		t.Errorf("%d calls; want 2 (the throttled one, then its retry)", n)
	}
	if took < 250*time.Millisecond || took > 3*time.Second {
		t.Errorf("took %v; want the ~0.3 s the server asked for", took)
	}
}

// TestSpotPricesContext: a call whose context ends while the API has not answered returns at
// once with the context's error; one whose context has already ended calls nothing.
func TestSpotPricesContext(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.change(func() { f.stall = true })
	p := newProvider(t, f, aws.Config{})

	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	got, err := p.SpotPrices(ctx, []string{"g5.xlarge"})
	took := time.Since(start)
	if err == nil || got != nil || !errors.Is(err, context.Canceled) {
		t.Errorf("SpotPrices, cancelled while stalled: %v, %v; want context.Canceled", got, err)
	}
	if took < 150*time.Millisecond || took > 2*time.Second {
		t.Errorf("returned after %v; want soon after the cancel at 200 ms", took)
	}
	if n := f.count("DescribeSpotPriceHistory"); n != 1 {
		t.Errorf("%d calls; want 1 (cancelled, not retried)", n)
	}

	got, err = p.SpotPrices(ctx, []string{"g5.xlarge"})
	if err == nil || got != nil || !errors.Is(err, context.Canceled) {
		t.Errorf("SpotPrices, already cancelled: %v, %v; want context.Canceled", got, err)
	}
	if n := f.count("DescribeSpotPriceHistory"); n != 1 {
		t.Errorf("%d calls in all; want still 1", n)
	}
}
