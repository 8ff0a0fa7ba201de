//go:build !amd64

package allreduce

var useAVX2 = false

func sumBytes(dst, src []byte, dt dtype) int { return 0 }
