package engine

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/iheap/iheaptest"
)

// TestFinishHeapConformance runs iheap's conformance suite against the
// heap of decoding requests: rank is the last step (the key), id the
// admission order (the tie breaker). The engine pops lazily and never
// fixes or removes in place, so its requests do not record positions and
// the suite skips those steps.
func TestFinishHeapConformance(t *testing.T) {
	iheaptest.Run(t, func(*testing.T) iheaptest.Adapter {
		return &finishAdapter{e: &Engine{fin: newFinishHeap()}}
	})
}

type finishAdapter struct{ e *Engine }

func (a *finishAdapter) Push(id, rank int) {
	a.e.fin.Push(finishKey(int64(rank)), &Seq{admitted: uint64(id)}, nil)
}

func (a *finishAdapter) Pop() int     { return int(a.e.fin.Pop().admitted) }
func (a *finishAdapter) Len() int     { return a.e.fin.Len() }
func (a *finishAdapter) At(i int) int { return int(a.e.fin.At(i).admitted) }
