//go:build !amd64

package allreduce

var useAVX2 = false

func sumBytes([]byte, []byte, dtype, bool) int { return 0 }
