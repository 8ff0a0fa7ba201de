// Package providers turns "the group" (a cloud autoscaling group, a fixed host list, a
// discovery script, this machine) into the hosts a job may run on. A provider answers one
// poll per call and starts no goroutines; the driver's discovery watcher owns the loop.
package providers

import (
	"context"
	"time"
)

// Host is one machine that can run workers.
type Host struct {
	// ID is stable for the life of the host (an instance ID, or the address for -H hosts).
	ID string
	// Addr is where workers are launched and peers connect (a DNS name or IP, no port).
	Addr string
	// Slots is how many workers the host runs (GPUs, or what the user said).
	Slots int
	Zone  string
	// Spot is true for spot / preemptible capacity.
	Spot bool
	Type string
	// Launched orders new hosts deterministically (then ID); zero when unknown.
	Launched time.Time
}

// Provider lists the hosts of the group: one poll per call, no goroutines inside.
type Provider interface {
	Hosts(ctx context.Context) ([]Host, error)
}
