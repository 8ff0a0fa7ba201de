package aws_test

import (
	"testing"

	"github.com/elasticd/elasticd/providers/aws"
)

// BenchmarkHosts10k is one discovery of a 10,000-instance group through the fake: the real
// SDK clients, the real wire format (XML), DescribeInstances at its largest page. The fake
// serves pre-rendered pages, so time and allocations are mostly the client's (the server's
// request handling in the same process is included).
func BenchmarkHosts10k(b *testing.B) {
	var insts []*fakeInst
	for i := range 10000 {
		in := inst(i + 1)
		in.Spot = i%2 == 0
		insts = append(insts, in)
	}
	f := newFake(b, insts...)
	p := newProvider(b, f, aws.Config{})
	if hosts, err := p.Hosts(pollCtx(b)); err != nil || len(hosts) != 10000 {
		b.Fatalf("%d hosts, %v", len(hosts), err) // also renders and keeps the pages
	}
	f.resetCounts()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := p.Hosts(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	calls := f.count("DescribeAutoScalingGroups") + f.count("DescribeInstances")
	b.ReportMetric(float64(calls)/float64(b.N), "calls/poll")
}
