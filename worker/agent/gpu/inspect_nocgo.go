//go:build !(linux && cgo)

package gpu

// Inspect cannot read GPUs in this build: go-nvml needs cgo on linux.
func Inspect(string) Inventory {
	return Inventory{Unsupported: true, Why: "this elasticd was built without cgo (or not for linux), so it cannot load NVML: it cannot read GPUs"}
}
