package providers_test

import (
	"testing"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/providertest"
)

func TestLocalConformance(t *testing.T) {
	providertest.Run(t, providertest.Harness{NewGroup: func(t *testing.T) providertest.Group {
		return providertest.Group{
			Provider: providers.NewLocal(3),
			Want: []providers.Host{
				{ID: "local-0", Addr: "127.0.0.1", Slots: 1, Type: providers.LocalType},
				{ID: "local-1", Addr: "127.0.0.1", Slots: 1, Type: providers.LocalType},
				{ID: "local-2", Addr: "127.0.0.1", Slots: 1, Type: providers.LocalType},
			},
		}
	}})
}

// --local-spot: the same hosts, counted as spot capacity.
func TestLocalSpotConformance(t *testing.T) {
	providertest.Run(t, providertest.Harness{NewGroup: func(t *testing.T) providertest.Group {
		return providertest.Group{
			Provider: providers.NewLocalSpot(2),
			Want: []providers.Host{
				{ID: "local-0", Addr: "127.0.0.1", Slots: 1, Type: providers.LocalType, Spot: true},
				{ID: "local-1", Addr: "127.0.0.1", Slots: 1, Type: providers.LocalType, Spot: true},
			},
		}
	}})
}

func TestFixedConformance(t *testing.T) {
	providertest.Run(t, providertest.Harness{NewGroup: func(t *testing.T) providertest.Group {
		hosts, err := providers.ParseHosts("gpu-b:2, gpu-a, 10.0.0.7:8, [fd00::1]:4", 1)
		if err != nil {
			t.Fatal(err)
		}
		return providertest.Group{
			Provider: providers.NewFixed(hosts),
			Want: []providers.Host{
				{ID: "gpu-b", Addr: "gpu-b", Slots: 2},
				{ID: "gpu-a", Addr: "gpu-a", Slots: 1},
				{ID: "10.0.0.7", Addr: "10.0.0.7", Slots: 8},
				{ID: "fd00::1", Addr: "fd00::1", Slots: 4},
			},
		}
	}})
}

func TestLocalBadSlots(t *testing.T) {
	for _, n := range []int{0, -1, providers.MaxSlots + 1} {
		if hosts, err := providers.NewLocal(n).Hosts(t.Context()); err == nil {
			t.Errorf("NewLocal(%d): hosts %v, no error", n, hosts)
		} else {
			t.Logf("NewLocal(%d): %v", n, err)
		}
	}
}

func TestFixedKeepsItsOwnCopy(t *testing.T) {
	in := []providers.Host{{ID: "a", Addr: "a", Slots: 1}}
	p := providers.NewFixed(in)
	in[0].Slots = 7
	got, err := p.Hosts(t.Context())
	if err != nil || len(got) != 1 || got[0].Slots != 1 {
		t.Fatalf("after the caller changed its slice: %v, %v; want the host with 1 slot", got, err)
	}
}
