package engine

import "slices"

// This file holds the adapter slots of the model: which LoRA adapters are
// resident in GPU memory, what loading one costs, and how many loads there
// were.
//
// At most MaxLoRAs adapters are resident (any number when it is 0). An
// adapter stays resident after its requests finish, so the next request of
// it runs without a load; admitting a request of an adapter that is not
// resident loads it into a free slot, or in place of the least recently
// used resident adapter that no running request uses. When every slot
// holds an adapter in use the request waits (admit skips it). Each load
// adds LoRALoadTime to the step that admits the request: vLLM loads
// adapters synchronously before the forward pass, so the whole batch
// waits for it.

// adapterSlots are the resident adapters, least recently used first.
type adapterSlots struct {
	resident []string
	loads    uint64
	// pending is the load time the next step pays.
	pending int64
}

// useAdapter makes adapter a resident for a request being admitted now
// (admit has checked that it can run: resident, a free slot, or an idle
// one to evict) and marks it most recently used.
func (e *Engine) useAdapter(a string) {
	sl := &e.slots
	if i := slices.Index(sl.resident, a); i >= 0 {
		sl.resident = append(slices.Delete(sl.resident, i, i+1), a)
		return
	}
	if m := e.cfg.MaxLoRAs; m > 0 && len(sl.resident) >= m {
		for i, x := range sl.resident {
			if e.loras[x] == 0 {
				sl.resident = slices.Delete(sl.resident, i, i+1)
				break
			}
		}
	}
	sl.resident = append(sl.resident, a)
	sl.loads++
	sl.pending += int64(e.cfg.scale(e.cfg.LoRALoadTime.Seconds()))
}

// takeLoadTime returns the load time the step starting now pays, once.
func (e *Engine) takeLoadTime() int64 {
	d := e.slots.pending
	e.slots.pending = 0
	return d
}

// ResidentAdapters returns the adapters resident now, least recently used
// first.
func (e *Engine) ResidentAdapters() []string { return slices.Clone(e.slots.resident) }
