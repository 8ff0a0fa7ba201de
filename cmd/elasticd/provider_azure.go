package main

import (
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/azure"
)

// newAzureProvider lists a Uniform virtual machine scale set (--subscription,
// --resource-group, --vmss; --endpoint overrides Azure Resource Manager's address).
// Credentials come from azidentity's DefaultAzureCredential. See docs/providers/azure.md.
func newAzureProvider(o providerOptions) (providers.Provider, error) {
	cfg := azure.Config{
		Subscription:  o.Subscription,
		ResourceGroup: o.ResourceGroup,
		VMSS:          o.VMSS,
		Endpoint:      o.Endpoint,
		SlotsPerHost:  o.SlotsPerHost,
		Logger:        o.Logger,
	}
	if o.DiscoveryTimeout > 0 {
		// A Retry-After waited for inside a poll leaves the poll time to finish.
		cfg.MaxRetryWait = min(azure.DefaultMaxRetryWait, o.DiscoveryTimeout/2)
	}
	p, err := azure.New(cfg)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return p, nil
}
