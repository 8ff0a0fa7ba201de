package main

import (
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/ibm"
)

// newIBMProvider watches an IBM Cloud VPC instance group: --instance-group (name or ID),
// --region (or --endpoint), --slots-per-host. Credentials come from the environment (see
// docs/providers/ibm.md); a missing key fails the first discovery, naming what to set.
func newIBMProvider(o providerOptions) (providers.Provider, error) {
	p, err := ibm.New(ibm.Config{
		InstanceGroup: o.InstanceGroup,
		Region:        o.Region,
		Endpoint:      o.Endpoint,
		SlotsPerHost:  o.SlotsPerHost,
		Logger:        o.Logger,
	})
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return p, nil
}
