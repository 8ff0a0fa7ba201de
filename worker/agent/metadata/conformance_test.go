package metadata_test

import (
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers/providertest"
	"github.com/elasticd/elasticd/worker/agent/metadata"
)

// The metadata services are noticers the agent watches with the same loop as the driver
// watches its provider: they pass the same notice cases.

func TestAWSConformance(t *testing.T) {
	providertest.RunNotices(t, providertest.NoticeHarness{NewSource: func(t *testing.T) providertest.NoticeSource {
		f := newFakeIMDS()
		return providertest.NoticeSource{
			Noticer: newAWS(t, f, metadata.Config{}),
			HostIDs: []string{awsInstance},
			// The service answers the standing spot action at every poll.
			Announce: func(t *testing.T) func(t *testing.T) {
				f.set(func(f *fakeIMDS) { f.spot = `{"action": "terminate", "time": "2026-11-22T01:02:03Z"}` })
				return func(t *testing.T) {}
			},
			Stall: func(t *testing.T) { f.set(func(f *fakeIMDS) { f.slow = true }) },
		}
	}})
}

func TestAzureConformance(t *testing.T) {
	providertest.RunNotices(t, providertest.NoticeHarness{NewSource: func(t *testing.T) providertest.NoticeSource {
		f := &fakeAzureIMDS{events: `{"DocumentIncarnation": 1, "Events": []}`}
		preempt := func(t *testing.T) func(t *testing.T) {
			f.set(func(f *fakeAzureIMDS) {
				f.events = `{"DocumentIncarnation": 2, "Events": [{"EventId": "A123BC45-1234-5678-AB90-ABCDEF123456",
  "EventStatus": "Scheduled", "EventType": "Preempt", "ResourceType": "VirtualMachine", "Resources": ["gpu-spot-vmss_3"],
  "NotBefore": "Sun, 22 Nov 2026 01:30:00 GMT", "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}]}`
			})
			return func(t *testing.T) {} // the document holds the event until it starts
		}
		return providertest.NoticeSource{
			Noticer: newAzure(t, f),
			HostIDs: []string{azureVM},
			// Any scheduled event may be acknowledged (StartRequests) to start it at once;
			// Azure takes a second acknowledgement of the same event as well.
			Announce:           preempt,
			AnnounceAnswerable: func(t *testing.T) { preempt(t) },
			Answered: func(t *testing.T) int {
				f.mu.Lock()
				defer f.mu.Unlock()
				return len(f.acks)
			},
			Stall: func(t *testing.T) { f.set(func(f *fakeAzureIMDS) { f.slow = true }) },
		}
	}})
}

func TestGCPConformance(t *testing.T) {
	providertest.RunNotices(t, providertest.NoticeHarness{NewSource: func(t *testing.T) providertest.NoticeSource {
		f := newFakeGCE()
		return providertest.NoticeSource{
			// A poll with nothing to say waits on preempted for a change: a second at most.
			Noticer: newGCP(t, f, metadata.Config{MaxWait: time.Second}),
			HostIDs: []string{gcpInstance},
			// preempted stays TRUE until the VM is gone: every poll answers it again.
			Announce: func(t *testing.T) func(t *testing.T) {
				f.set(func(f *fakeGCE) { f.preempted = "TRUE" })
				return func(t *testing.T) {}
			},
			Stall: func(t *testing.T) { f.set(func(f *fakeGCE) { f.slow = true }) },
		}
	}})
}
