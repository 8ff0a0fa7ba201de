package providers

import (
	"context"
	"fmt"
	"slices"
)

// NewFixed is a group that never changes, such as the hosts of -H (see ParseHosts). It keeps
// its own copy of hosts, and every poll returns a fresh copy the caller may modify.
func NewFixed(hosts []Host) Provider { return fixed{hosts: slices.Clone(hosts)} }

type fixed struct{ hosts []Host }

func (f fixed) Hosts(ctx context.Context) ([]Host, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fixed hosts: %w", err)
	}
	return slices.Clone(f.hosts), nil
}
