package allreduce

import "testing"

func TestNonTemporalSwitch(t *testing.T) {
	for _, c := range []struct {
		env       string
		has, want bool
	}{
		{"", true, true}, {"", false, false}, {"1", true, true}, {"0", true, false},
		{" OFF ", true, false}, {"false", true, false}, {"no", true, false}, {"1", false, false},
	} {
		if got := nonTemporal(c.env, c.has); got != c.want {
			t.Errorf("nonTemporal(%q, %t) = %t, want %t", c.env, c.has, got, c.want)
		}
	}
}
