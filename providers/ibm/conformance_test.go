package ibm_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/ibm"
	"github.com/elasticd/elasticd/providers/providertest"
)

// TestConformance runs the shared suite against the real SDK client and the fake, once with
// every poll reaching the API and once with the cache of MinInterval in the way (the harness
// then lets MinInterval pass after it changes the group, as the driver's next polls would).
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		minInterval time.Duration
	}{
		{"Uncached", time.Nanosecond},
		{"Cached", 50 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			providertest.Run(t, providertest.Harness{NewGroup: func(t *testing.T) providertest.Group {
				ins := instances(5)
				f := newFake(t, ins...)
				p := f.provider(t, ibm.Config{MinInterval: c.minInterval})
				settle := func() { time.Sleep(c.minInterval) }
				return providertest.Group{
					Provider: p,
					Want:     hostsOf(ins),
					Change: func(t *testing.T) []providers.Host {
						// One member goes, two come.
						next := slices.Clone(instances(7)[1:])
						f.update(func(f *fakeVPC) { f.instances = next })
						settle()
						return hostsOf(next)
					},
					Fail: func(t *testing.T) {
						f.stick(epMemberships, &reply{status: http.StatusInternalServerError, file: "error_internal.json"})
						settle()
					},
					Stall: func(t *testing.T) { f.update(func(f *fakeVPC) { f.stalled = true }) },
				}
			}})
		})
	}
}
