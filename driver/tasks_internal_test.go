package driver

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// The launches of a generation are listed one by one up to launchLogsListed, then once
// summed up; the rest go to debug, and a new generation is listed again.
func TestLaunchLogsListed(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var l launchLogs
	count := func(gen uint64, n int) (info int) {
		for range n {
			if l.level(gen, log) == slog.LevelInfo {
				info++
			}
		}
		return info
	}
	if got := count(1, launchLogsListed+10); got != launchLogsListed {
		t.Errorf("generation 1: %d of %d launches at info, want %d", got, launchLogsListed+10, launchLogsListed)
	}
	if got := strings.Count(buf.String(), "more workers of generation 1 launched"); got != 1 {
		t.Errorf("the summing up logged %d times, want once:\n%s", got, buf.String())
	}
	if got := count(2, 3); got != 3 {
		t.Errorf("generation 2: %d of 3 launches at info, want 3", got)
	}
}
