package allreduce

import "testing"

func TestParsePolicy(t *testing.T) {
	for _, c := range []struct {
		env  string
		want policy
		ok   bool
	}{
		{"", policyAuto, true}, {"auto", policyAuto, true}, {" AUTO ", policyAuto, true},
		{"1", policyAlways, true}, {"on", policyAlways, true}, {"yes", policyAlways, true}, {"True", policyAlways, true},
		{"0", policyNever, true}, {" OFF ", policyNever, true}, {"false", policyNever, true}, {"no", policyNever, true},
		{"2", policyAuto, false}, {"sometimes", policyAuto, false},
	} {
		if got, ok := parsePolicy(c.env); got != c.want || ok != c.ok {
			t.Errorf("parsePolicy(%q) = %v, %t; want %v, %t", c.env, got, ok, c.want, c.ok)
		}
	}
}

func TestNTFrom(t *testing.T) {
	shared := cacheInfo{size: 300 << 20, shared: true}
	for _, c := range []struct {
		name  string
		p     policy
		hw    bool
		llc   cacheInfo
		ranks int
		want  int64
	}{
		{"no AVX", policyAlways, false, cacheInfo{}, 2, -1},
		{"off", policyNever, true, cacheInfo{}, 2, -1},
		{"on, even with one cache", policyAlways, true, shared, 2, 0},
		{"auto, caches unknown", policyAuto, true, cacheInfo{}, 2, 0},
		{"auto, caches split", policyAuto, true, cacheInfo{size: 32 << 20}, 2, 0},
		{"auto, one cache, 2 ranks", policyAuto, true, shared, 2, 150 << 20},
		{"auto, one cache, 8 ranks", policyAuto, true, shared, 8, 300 << 20 / 8},
		{"auto, one cache, no count", policyAuto, true, shared, 0, 300 << 20},
	} {
		if got := ntFrom(c.p, c.hw, c.llc, c.ranks); got != c.want {
			t.Errorf("%s: ntFrom = %d, want %d", c.name, got, c.want)
		}
	}
}
