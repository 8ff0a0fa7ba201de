package azure_test

import (
	"slices"
	"testing"

	"github.com/elasticd/elasticd/providers/azure"
)

// The NIC listing is what a poll spares when it knows every VM's address: a NIC keeps its
// private IP while it exists, and a VM keeps its NICs while it keeps running. These tests
// hold the provider to reading an address again whenever that may no longer be so.

// knownAddrs fails the test unless the provider keeps addresses for exactly these hosts.
func knownAddrs(t *testing.T, p *azure.Provider, want ...string) {
	t.Helper()
	if got := azure.KnownAddrs(p); !slices.Equal(got, want) {
		t.Errorf("addresses kept for %q; want %q", got, want)
	}
}

// nicCalls fails the test unless the NIC listing has been asked for n pages in all.
func nicCalls(t *testing.T, f *fakeARM, n int, why string) {
	t.Helper()
	if got := f.count(epNICs); got != n {
		t.Errorf("%d NIC listings in all; want %d: %s", got, n, why)
	}
}

// TestAddressesAreReadOnce: the NICs of an unchanged set are listed by the first poll only;
// the polls after it make two calls, the scale set and its VMs, and list the same hosts.
func TestAddressesAreReadOnce(t *testing.T) {
	vms := []fakeVM{vm("0", "10.0.0.4"), vm("1", "10.0.0.5"), vm("2", "10.0.0.6")}
	f := newFake(t, vms...)
	p := f.provider(t)
	sameHosts(t, "first poll", poll(t, p), f.wants(vms...))
	nicCalls(t, f, 1, "the first poll reads every address")
	for range 3 {
		before := f.count("")
		sameHosts(t, "a later poll", poll(t, p), f.wants(vms...))
		if n := f.count("") - before; n != 2 {
			t.Errorf("a poll of an unchanged set made %d calls; want 2 (the scale set, its VMs)", n)
		}
	}
	nicCalls(t, f, 1, "nothing changed")
	knownAddrs(t, p, "gpus_0", "gpus_1", "gpus_2")
}

// TestAddressesOfNewVMs: a VM new to the listing has its address read, with the NICs of the
// whole set in the same listing.
func TestAddressesOfNewVMs(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	p := f.provider(t)
	poll(t, p)
	now := []fakeVM{vm("0", "10.0.0.4"), vm("1", "10.0.0.5")}
	f.setVMs(now...)
	sameHosts(t, "after a scale-out", poll(t, p), f.wants(now...))
	nicCalls(t, f, 2, "VM 1 is new")
	poll(t, p)
	nicCalls(t, f, 2, "nothing changed since")
}

// TestAddressesOfGoneVMsAreDropped: the addresses kept are those of the latest listing's VMs
// and no others; a VM that comes back under a gone VM's name has its address read again.
func TestAddressesOfGoneVMsAreDropped(t *testing.T) {
	vms := []fakeVM{vm("0", "10.0.0.4"), vm("1", "10.0.0.5"), vm("2", "10.0.0.6")}
	f := newFake(t, vms...)
	p := f.provider(t)
	poll(t, p)
	knownAddrs(t, p, "gpus_0", "gpus_1", "gpus_2")

	f.setVMs(vms[0], vms[2])
	sameHosts(t, "after VM 1 went", poll(t, p), f.wants(vms[0], vms[2]))
	knownAddrs(t, p, "gpus_0", "gpus_2")
	nicCalls(t, f, 1, "no VM is new")

	back := vm("1", "10.0.0.99") // the same name and creation time, another address
	f.setVMs(vms[0], back, vms[2])
	sameHosts(t, "after VM 1 came back", poll(t, p), f.wants(vms[0], back, vms[2]))
	nicCalls(t, f, 2, "VM 1 is new again")

	f.setVMs()
	if got := poll(t, p); len(got) != 0 {
		t.Errorf("hosts of an empty set: %v", got)
	}
	knownAddrs(t, p)
}

// TestAddressesFollowStates: what may change is read at every poll: a VM's power state (a
// spot eviction) shows at once; its address is read again when it runs after a stop, a
// deallocation or a model update, and at every poll while it runs without one.
func TestAddressesFollowStates(t *testing.T) {
	a, b := vm("0", "10.0.0.4"), vm("1", "10.0.0.5")
	f := newFake(t, a, b)
	p := f.provider(t)
	poll(t, p)

	// Evicted (Deallocate policy): leaving at the next poll, under the address it had.
	evicted := b
	evicted.Power = "deallocated"
	f.setVMs(a, evicted)
	sameHosts(t, "after the eviction", poll(t, p), f.wants(a, evicted))
	nicCalls(t, f, 1, "a leaving VM keeps the address it had")
	poll(t, p)
	nicCalls(t, f, 1, "the VM is still deallocated")

	// Started again, with another address: read again.
	restarted := b
	restarted.IP = "10.0.0.50"
	f.setVMs(a, restarted)
	sameHosts(t, "after the restart", poll(t, p), f.wants(a, restarted))
	nicCalls(t, f, 2, "the VM runs again after a deallocation")
	poll(t, p)
	nicCalls(t, f, 2, "nothing changed since")

	// A model update that keeps the VM running: read while it lasts and once after it.
	updating := restarted
	updating.Prov = "Updating"
	f.setVMs(a, updating)
	poll(t, p)
	poll(t, p)
	nicCalls(t, f, 4, "the VM is being updated")
	moved := restarted
	moved.IP = "10.0.1.50"
	f.setVMs(a, moved)
	sameHosts(t, "after the update", poll(t, p), f.wants(a, moved))
	nicCalls(t, f, 5, "the update ended: the address it ended with")
	poll(t, p)
	nicCalls(t, f, 5, "nothing changed since")

	// Running without a NIC yet: read at every poll until it has one.
	noNIC := vm("2", "")
	f.setVMs(a, moved, noNIC)
	poll(t, p)
	poll(t, p)
	nicCalls(t, f, 7, "VM 2 has no address yet")
	withNIC := vm("2", "10.0.0.6")
	f.setVMs(a, moved, withNIC)
	sameHosts(t, "once VM 2 has its NIC", poll(t, p), f.wants(a, moved, withNIC))
	poll(t, p)
	nicCalls(t, f, 8, "VM 2 has its address")
}

// TestFailedNICListingKeepsNothing: a poll whose NIC listing fails changes nothing kept, and
// the next poll lists the NICs again.
func TestFailedNICListingKeepsNothing(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	p := f.provider(t)
	poll(t, p)
	f.setVMs(vm("0", "10.0.0.4"), vm("1", "10.0.0.5"))
	f.queue(epNICs, reply{file: "nics_bad_ip.json"})
	pollErr(t, p)
	knownAddrs(t, p, "gpus_0")
	sameHosts(t, "the poll after", poll(t, p), f.wants(vm("0", "10.0.0.4"), vm("1", "10.0.0.5")))
	nicCalls(t, f, 3, "the first poll, the failed one, and the one after it")
}
