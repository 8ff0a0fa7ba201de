package ibm_test

import (
	"testing"

	"github.com/elasticd/elasticd/providers/ibm"
)

// BenchmarkHosts10k: one poll of a 10,000-instance group through the fake (real SDK client,
// real JSON, loopback HTTP): requests a poll, time and allocations a poll. The time includes
// the fake serving about 100 pages of instance JSON as the API would.
func BenchmarkHosts10k(b *testing.B) {
	const n = 10000
	f := newFake(b, instances(n)...)
	p := f.provider(b, ibm.Config{})
	ctx := b.Context()
	if hosts, err := p.Hosts(ctx); err != nil || len(hosts) != n { // finds the group, warms the fake's cache
		b.Fatalf("Hosts: %d hosts, %v", len(hosts), err)
	}
	before := f.total()
	b.ReportAllocs()
	polls := 0
	for b.Loop() {
		if _, err := p.Hosts(ctx); err != nil {
			b.Fatal(err)
		}
		polls++
	}
	b.ReportMetric(float64(f.total()-before)/float64(polls), "calls/poll")
}
