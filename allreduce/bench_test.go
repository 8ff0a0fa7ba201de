package allreduce_test

import (
	"fmt"
	"testing"

	"github.com/elasticd/elasticd/allreduce"
)

// BenchmarkAllreduce measures an in-process float32 Sum over loopback TCP; MB/s is bytes of
// the buffer reduced per second on each rank.
func BenchmarkAllreduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, size := range []struct {
			name  string
			bytes int
		}{{"4KB", 4 << 10}, {"1MB", 1 << 20}, {"64MB", 64 << 20}} {
			b.Run(fmt.Sprintf("n=%d/%s", n, size.name), func(b *testing.B) {
				comms := newWorld(b, n, 1, nil, nil)
				bufs := make([][]float32, n)
				for r := range bufs {
					bufs[r] = make([]float32, size.bytes/4)
				}
				b.SetBytes(int64(size.bytes))
				b.ReportAllocs()
				b.ResetTimer()
				errs := onAll(comms, func(r int, c *allreduce.Comm) error {
					for range b.N {
						if err := c.Allreduce(b.Context(), bufs[r], allreduce.Sum); err != nil {
							return err
						}
					}
					return nil
				})
				b.StopTimer()
				mustAll(b, errs)
			})
		}
	}
}
