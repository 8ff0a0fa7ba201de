package providers

// SameHost reports whether a and b describe a host identically: every field equal, Launched
// compared as an instant (time.Time's == also compares the location and monotonic reading).
func SameHost(a, b Host) bool {
	return a.ID == b.ID && a.Addr == b.Addr && a.Slots == b.Slots && a.Zone == b.Zone &&
		a.Spot == b.Spot && a.Type == b.Type && a.Launched.Equal(b.Launched) && a.Leaving == b.Leaving &&
		a.Fallback == b.Fallback
}
