package providers

import (
	"context"
	"fmt"
	"strconv"
)

// NewLocal is this machine as slots hosts of one slot each, "local-0" … "local-<slots-1>", all
// at 127.0.0.1. One slot per host means a failed worker blacklists only its own slot, which
// returns after its cooldown; a single host of N slots would lose all N at once. Every host
// has the same (zero) launch time, so the host manager orders them by ID.
//
// A slot count outside 1…MaxSlots makes every poll fail, and so the job's start.
func NewLocal(slots int) Provider { return local{slots: slots} }

// NewLocalSpot is NewLocal with the hosts counted as spot capacity, for trying the cost
// accounting on one machine (elasticd run --local-spot).
func NewLocalSpot(slots int) Provider { return local{slots: slots, spot: true} }

// LocalType is the instance type of the local hosts, for price files.
const LocalType = "local"

type local struct {
	slots int
	spot  bool
}

func (l local) Hosts(ctx context.Context) ([]Host, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("local hosts: %w", err)
	}
	if err := checkSlots(l.slots); err != nil {
		return nil, fmt.Errorf("local hosts: %w", err)
	}
	hosts := make([]Host, l.slots)
	for i := range hosts {
		hosts[i] = Host{ID: "local-" + strconv.Itoa(i), Addr: "127.0.0.1", Slots: 1, Type: LocalType, Spot: l.spot}
	}
	return hosts, nil
}
