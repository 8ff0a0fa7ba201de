package main

import (
	"testing"

	"github.com/elasticd/elasticd/providers"
)

// TestAWSProviderCapabilities: the driver finds a provider's optional capabilities by type
// assertion, so what newAWSProvider returns must show spot prices with or without a queue,
// and notices only with one. Nothing is contacted: the provider calls nothing until a poll.
func TestAWSProviderCapabilities(t *testing.T) {
	const endpoint = "http://127.0.0.1:1"
	for _, c := range []struct {
		name    string
		queue   string
		notices bool
	}{
		{"WithoutQueue", "", false},
		{"WithQueue", endpoint + "/123456789012/elasticd-notices", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := newAWSProvider(providerOptions{
				ASG: "gpu-workers", Region: "us-east-1", Endpoint: endpoint, SQSQueueURL: c.queue,
			})
			if err != nil {
				t.Fatalf("newAWSProvider: %v", err)
			}
			if _, ok := p.(providers.SpotPricer); !ok {
				t.Errorf("%T is not a providers.SpotPricer", p)
			}
			if _, ok := p.(providers.Noticer); ok != c.notices {
				t.Errorf("%T is a providers.Noticer: %v; want %v", p, ok, c.notices)
			}
			if _, ok := p.(providers.NoticeCompleter); ok != c.notices {
				t.Errorf("%T is a providers.NoticeCompleter: %v; want %v", p, ok, c.notices)
			}
		})
	}
}
