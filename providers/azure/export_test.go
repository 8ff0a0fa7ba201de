package azure

import (
	"maps"
	"slices"
	"time"
)

// GPUSizes is how many sizes the GPU table holds, for the test that holds the docs to it.
func GPUSizes() int { return len(gpus) }

// SetLROPollInterval makes p poll long-running operations every d when the server names no
// Retry-After, so that tests of the fake's operations take milliseconds.
func SetLROPollInterval(p *Provider, d time.Duration) { p.lroEvery = d }

// KnownAddrs lists the hosts whose addresses p keeps between polls, sorted.
func KnownAddrs(p *Provider) []string { return slices.Sorted(maps.Keys(p.addrs)) }
