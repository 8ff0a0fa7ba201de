package gcp

import "testing"

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
}
