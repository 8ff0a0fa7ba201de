package bench

import (
	"testing"
	"time"
)

func TestLoggedAt(t *testing.T) {
	now := time.Date(2026, 11, 26, 0, 0, 0, 500_000_000, time.Local)
	for _, tc := range []struct {
		line string
		want time.Time
	}{
		{`time=23:59:59.900 level=INFO msg="agent notice" host=i-1`, time.Date(2026, 11, 25, 23, 59, 59, 900_000_000, time.Local)},
		{`time=00:00:00.250 level=INFO msg="agent notice"`, time.Date(2026, 11, 26, 0, 0, 0, 250_000_000, time.Local)},
		{`level=INFO msg="agent notice"`, now},
		{`time=nonsense msg="agent notice"`, now},
		{`time=00:00:01.000 msg="agent notice"`, now}, // not after the read
	} {
		if got := loggedAt(tc.line, now); !got.Equal(tc.want) {
			t.Errorf("loggedAt(%q) = %v, want %v", tc.line, got, tc.want)
		}
	}
}
