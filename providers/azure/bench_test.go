package azure_test

import (
	"testing"
)

// BenchmarkHosts10k is one discovery of a 10,000-VM scale set through the fake, pages of
// 1,000 (VMs with their instance view, and NICs): time and allocations per poll, and API
// calls per poll. The fake's own work (serving pre-rendered pages over loopback HTTP) is
// inside the time.
func BenchmarkHosts10k(b *testing.B) {
	const n = 10_000
	f := newFake(b, manyVMs(n)...)
	f.setPageSize(1000)
	p := f.provider(b)
	if hosts, err := p.Hosts(b.Context()); err != nil || len(hosts) != n { // renders the fake's pages
		b.Fatalf("Hosts: %d hosts, %v; want %d", len(hosts), err, n)
	}
	before := f.count("")
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		hosts, err := p.Hosts(b.Context())
		if err != nil || len(hosts) != n {
			b.Fatalf("Hosts: %d hosts, %v; want %d", len(hosts), err, n)
		}
	}
	b.ReportMetric(float64(f.count("")-before)/float64(b.N), "calls/poll")
}
