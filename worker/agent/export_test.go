package agent

import "time"

// SetLoadEvery shortens how often the agent reports GPU busy, for tests; the returned func
// restores it.
func SetLoadEvery(d time.Duration) func() {
	old := loadEvery
	loadEvery = d
	return func() { loadEvery = old }
}
