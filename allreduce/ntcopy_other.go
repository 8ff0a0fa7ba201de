//go:build !amd64

package allreduce

// ntHardware: ringCopy has no non-temporal path on this architecture.
var ntHardware = false

// ringCopy is copy(dst, src) for bytes going into a shared-memory ring (ntcopy_amd64.go).
func ringCopy(dst, src []byte, _ bool) int { return copy(dst, src) }
