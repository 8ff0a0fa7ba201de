package worker

import "time"

// SetLoadEvery shortens how often workers report their step time, for tests; the returned
// func restores it.
func SetLoadEvery(d time.Duration) func() {
	old := loadEvery
	loadEvery = d
	return func() { loadEvery = old }
}
