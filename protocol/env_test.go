package protocol_test

import (
	"testing"

	"github.com/elasticd/elasticd/protocol"
)

func TestEnvValue(t *testing.T) {
	env := []string{"A=1", "AB=2", "B=", "A=3", "C==x"}
	for _, tc := range []struct {
		name, want string
		ok         bool
	}{
		{"A", "3", true}, // the last one wins
		{"AB", "2", true},
		{"B", "", true},
		{"C", "=x", true},
		{"D", "", false},
	} {
		if got, ok := protocol.EnvValue(env, tc.name); got != tc.want || ok != tc.ok {
			t.Errorf("EnvValue(%q) = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
