package schedtest

import (
	"github.com/laneway-dev/laneway/pkg/sched"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// TicketWrapper builds a sched.Ticket. Its zero settings are a ticket with
// no prompt; Prompt gives it one of token ids.
type TicketWrapper struct {
	t          sched.Ticket
	n, shared  int
	base, seed uint32
	blockSize  int
}

// Ticket starts a ticket: base 1, seed 1, blocks of 16 tokens once it has
// a prompt.
func Ticket() *TicketWrapper { return &TicketWrapper{base: 1, seed: 1, blockSize: 16} }

// Prompt gives the ticket a prompt of n token ids (its RawISL), hashed
// into blocks for the prefix index.
func (w *TicketWrapper) Prompt(n int) *TicketWrapper { w.n = n; return w }

// Shared makes the prompt's first k tokens those of every prompt of the
// same base; the rest are the seed's own.
func (w *TicketWrapper) Shared(k int) *TicketWrapper { w.shared = k; return w }

// Base chooses the family of prompts whose shared tokens this one has.
func (w *TicketWrapper) Base(b uint32) *TicketWrapper { w.base = b; return w }

// Seed chooses the unshared tokens: prompts of different seeds differ
// after their shared part.
func (w *TicketWrapper) Seed(s uint32) *TicketWrapper { w.seed = s; return w }

// BlockSize is the tokens per hashed block.
func (w *TicketWrapper) BlockSize(bs int) *TicketWrapper { w.blockSize = bs; return w }

// Obj returns the ticket.
func (w *TicketWrapper) Obj() *sched.Ticket {
	t := w.t
	if w.n > 0 {
		t.RawISL, t.BlockSize = uint64(w.n), w.blockSize
		t.Blocks = tokenize.BlockHashes(w.tokens(), w.blockSize)
	}
	return &t
}

// tokens is the prompt's token ids.
func (w *TicketWrapper) tokens() []uint32 {
	toks := make([]uint32, w.n)
	for i := range toks {
		if i < w.shared {
			toks[i] = w.base*100003 + uint32(i)
		} else {
			toks[i] = w.seed*7919 + uint32(i)*31 + 1<<30
		}
	}
	return toks
}
