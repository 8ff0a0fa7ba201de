package gcp

import (
	"testing"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"
)

func TestNameFilterAndURLs(t *testing.T) {
	for _, c := range []struct {
		url        string
		zone, name string
		ok         bool
	}{
		{"https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/instances/gpu-1", "us-central1-a", "gpu-1", true},
		{"projects/p/zones/z/instances/n", "z", "n", true},
		{"https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/instances/", "", "", false},
		{"https://www.googleapis.com/compute/v1/projects/p/regions/r/instances/n", "", "", false},
		{"", "", "", false},
		{"n", "", "", false},
	} {
		zone, name, ok := zoneAndName(c.url)
		if zone != c.zone || name != c.name || ok != c.ok {
			t.Errorf("zoneAndName(%q) = %q, %q, %v; want %q, %q, %v", c.url, zone, name, ok, c.zone, c.name, c.ok)
		}
	}
	for _, c := range []struct {
		names []string
		want  string
	}{
		{[]string{"gpu-a1x", "gpu-a2yz", "gpu-b9"}, `name eq "gpu-.*"`},
		{[]string{"gpu-abcd"}, `name eq "gpu-abcd.*"`},
		{[]string{"alpha", "beta"}, ""}, // no common prefix: the zone's whole list
	} {
		var mis []*computepb.ManagedInstance
		for _, n := range c.names {
			mis = append(mis, &computepb.ManagedInstance{Instance: proto.String("projects/p/zones/z/instances/" + n)})
		}
		if got := nameFilter(mis); got != c.want {
			t.Errorf("nameFilter(%q) = %q; want %q", c.names, got, c.want)
		}
	}
}
