package agent

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/elasticd/elasticd/worker/agent/gpu"
)

// VisibleGPUs narrows src to the GPUs that spec, the agent's own CUDA_VISIBLE_DEVICES, names,
// in spec's order: an operator who starts the agent with CUDA_VISIBLE_DEVICES=2,3 offers the
// driver those two GPUs alone, and the workers see no others. NVML, which src reads, lists
// every GPU of the host whatever the variable says. An entry is a GPU's index as nvidia-smi
// numbers it (NVML's, which is CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID) or its UUID, whole
// or a prefix that names one GPU ("GPU-8f3a"). As CUDA does, the list ends at a negative
// index ("-1", the usual way to hide every GPU). Any other entry, an unknown index or UUID,
// an entry named twice, or a MIG device is an error that names it: the agent would otherwise
// hand out GPUs the operator did not mean.
//
// The result reports faults of its GPUs alone, numbered by their place in its list (the
// driver maps a fault to slots by that place), and the utilization of its GPUs alone.
func VisibleGPUs(src GPUSource, spec string) (GPUSource, error) {
	all := src.GPUs()
	v := &visibleGPUs{src: src, from: make(map[int]int)}
	for _, e := range strings.Split(spec, ",") {
		e = strings.TrimSpace(e)
		pos, err := findGPU(all, e)
		if err != nil {
			return nil, fmt.Errorf("CUDA_VISIBLE_DEVICES=%s: %w", spec, err)
		}
		if pos < 0 {
			break
		}
		if _, dup := v.from[pos]; dup {
			return nil, fmt.Errorf("CUDA_VISIBLE_DEVICES=%s: %q names GPU %d again", spec, e, all[pos].Index)
		}
		v.from[pos] = len(v.pos)
		v.pos = append(v.pos, pos)
		v.gpus = append(v.gpus, all[pos])
	}
	return v, nil
}

// findGPU is the place in all of the GPU that entry e names, or -1 for a negative index (the
// end of the list).
func findGPU(all []gpu.GPU, e string) (int, error) {
	indices := func() string {
		s := make([]string, len(all))
		for i, g := range all {
			s[i] = strconv.Itoa(g.Index)
		}
		return strings.Join(s, ", ")
	}
	switch n, err := strconv.Atoi(e); {
	case err == nil && n < 0:
		return -1, nil
	case err == nil:
		for i, g := range all {
			if g.Index == n {
				return i, nil
			}
		}
		return 0, fmt.Errorf("no GPU %d on this host (NVML lists %s)", n, indices())
	case strings.HasPrefix(strings.ToUpper(e), "MIG-"):
		return 0, fmt.Errorf("%q is a MIG device: the agent gives out whole GPUs; list those", e)
	case strings.HasPrefix(strings.ToUpper(e), "GPU-"):
		found := -1
		for i, g := range all {
			if strings.HasPrefix(strings.ToLower(g.UUID), strings.ToLower(e)) {
				if found >= 0 {
					return 0, fmt.Errorf("%q is the start of more than one GPU's UUID (%s, %s): give more of it", e, all[found].UUID, g.UUID)
				}
				found = i
			}
		}
		if found < 0 {
			return 0, fmt.Errorf("no GPU with UUID %q on this host (nvidia-smi -L lists them)", e)
		}
		return found, nil
	}
	return 0, fmt.Errorf("%q is neither a GPU index nor a UUID (GPU-...)", e)
}

// visibleGPUs is VisibleGPUs' answer.
type visibleGPUs struct {
	src  GPUSource
	gpus []gpu.GPU   // the kept GPUs, in the list's order
	pos  []int       // each kept GPU's place in src.GPUs()
	from map[int]int // a place in src.GPUs() to its place in gpus
}

func (v *visibleGPUs) GPUs() []gpu.GPU { return slices.Clone(v.gpus) }

// Watch passes on the faults of the kept GPUs, renumbered, and those NVML could not place
// (GPU -1); a fault of another GPU is none of this agent's business.
func (v *visibleGPUs) Watch(ctx context.Context, out chan<- gpu.Event) error {
	in := make(chan gpu.Event)
	done := make(chan error, 1)
	go func() { done <- v.src.Watch(ctx, in) }()
	for {
		select {
		case err := <-done:
			return err
		case ev := <-in:
			if ev.GPU >= 0 {
				i, ok := v.from[ev.GPU]
				if !ok {
					continue
				}
				ev.GPU = i
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return <-done
			}
		}
	}
}

// Utilization is the kept GPUs' busy fractions, where src can say.
func (v *visibleGPUs) Utilization() ([]float64, error) {
	u, ok := v.src.(interface{ Utilization() ([]float64, error) })
	if !ok {
		return nil, nil
	}
	busy, err := u.Utilization()
	if err != nil {
		return nil, err
	}
	out := make([]float64, 0, len(v.pos))
	for _, p := range v.pos {
		if p < len(busy) {
			out = append(out, busy[p])
		}
	}
	return out, nil
}
