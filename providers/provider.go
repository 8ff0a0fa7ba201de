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
	// Leaving is true when the cloud is already taking the host away (being deleted,
	// stopping, deallocating): the job moves off it at once, without rollback.
	Leaving bool
	// Fallback is true for a host of the job's on-demand fallback group (WithFallback): the
	// job moves off it once its spot group can carry it again.
	Fallback bool
}

// Provider lists the hosts of the group: one poll per call, no goroutines inside.
type Provider interface {
	Hosts(ctx context.Context) ([]Host, error)
}

// NoticeKind says what a notice announces.
type NoticeKind string

const (
	// Interruption: the cloud takes the host back (spot reclaim, preemption) at Deadline.
	Interruption NoticeKind = "interruption"
	// Rebalance: the cloud warns of an elevated risk of interruption.
	Rebalance NoticeKind = "rebalance"
	// ScaleIn: the group is removing the host (for example an ASG terminate lifecycle action).
	ScaleIn NoticeKind = "scale-in"
	// Maintenance: a scheduled event (a stop, a retirement, a health scheduled change).
	Maintenance NoticeKind = "maintenance"
)

// Notice is the control plane announcing that a host will go away.
type Notice struct {
	// ID de-duplicates notices (a message or event ID); the same ID is one notice.
	ID string
	// HostID is the Host.ID concerned.
	HostID string
	Kind   NoticeKind
	// Deadline is when the host goes away; zero when the cloud does not say.
	Deadline time.Time
	// Detail is a human-readable summary (the event type, the cloud's reason).
	Detail string
	// Token is provider-private data needed to complete the notice (e.g. a lifecycle token).
	Token string
}

// Noticer is implemented by providers that learn from the control plane that hosts will go
// away: one poll per call, like Hosts.
type Noticer interface {
	Notices(ctx context.Context) ([]Notice, error)
}

// NoticeCompleter is implemented by providers whose notices must be answered once the
// host's workers are gone (an ASG terminate lifecycle hook waits for it).
type NoticeCompleter interface {
	CompleteNotice(ctx context.Context, n Notice) error
}

// SlotsFor is the slot count of an instance type: override when positive, else the GPU count
// from table (each cloud keeps its own table of common GPU types), else 1.
func SlotsFor(instanceType string, table map[string]int, override int) int {
	if override > 0 {
		return override
	}
	if n := table[instanceType]; n > 0 {
		return n
	}
	return 1
}

// SpotPricer is implemented by providers that can read the cloud's current spot prices (AWS:
// DescribeSpotPriceHistory). The driver's cost accounting calls it about hourly and caches
// the answer; a price file covers what it does not answer.
type SpotPricer interface {
	// SpotPrices returns the current spot price per hour of each instance type asked for, by
	// zone: prices[type][zone]. Types or zones the cloud has no price for are left out.
	SpotPrices(ctx context.Context, types []string) (map[string]map[string]float64, error)
}
