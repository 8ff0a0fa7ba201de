package main

import (
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/gcp"
)

// newGCPProvider lists a Compute Engine managed instance group: --mig in --project, zonal
// with --zone or regional with --region; credentials from Application Default Credentials.
func newGCPProvider(o providerOptions) (providers.Provider, error) {
	p, err := gcp.New(gcp.Config{
		Project:      o.Project,
		Zone:         o.Zone,
		Region:       o.Region,
		MIG:          o.MIG,
		Endpoint:     o.Endpoint,
		SlotsPerHost: o.SlotsPerHost,
		Logger:       o.Logger,
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}
