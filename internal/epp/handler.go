package epp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"

	"github.com/laneway-dev/laneway/internal/dispatcher"
	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

// RequestParser turns a request into the parts of a ticket that come from
// its body and headers: model, prompt length and ordering hints. An error
// answers 400.
type RequestParser interface {
	Parse(req *extproc.Request, t *dispatcher.Ticket) error
}

// Acquirer is the dispatcher as the handler uses it.
type Acquirer interface {
	Acquire(ctx context.Context, t *dispatcher.Ticket) (*dispatcher.Grant, error)
}

// Handler is the ext_proc Decider: parse, acquire, answer.
type Handler struct {
	Parser     RequestParser
	Dispatcher Acquirer
	// Gate, when set, is asked first: a non-empty reason ("not_ready",
	// "not_leader") answers 503 with that reason, so a gateway that reaches
	// a replica that must not schedule (a follower, one whose caches are not
	// synced) retries another.
	Gate func() string
	// Hooks, when set, hash prompts for the prefix index and see every
	// routed request (metrics, priority forwarding).
	Hooks RequestHooks
}

var _ extproc.Decider = (*Handler)(nil)

// Decide implements extproc.Decider.
func (h *Handler) Decide(ctx context.Context, req *extproc.Request) (extproc.Decision, error) {
	if h.Gate != nil {
		if reason := h.Gate(); reason != "" {
			return extproc.Decision{}, jsonReply(http.StatusServiceUnavailable, reason, "this endpoint picker replica is not serving ("+reason+")", nil)
		}
	}
	t := tickets.Get().(*dispatcher.Ticket)
	ps, err := h.parse(req, t)
	if err != nil {
		recycleParsed(ps, t)
		putTicket(t)
		return extproc.Decision{}, &extproc.Reply{Status: http.StatusBadRequest, Reason: "malformed_body", Message: err.Error()}
	}
	t.Allow, t.HasAllow = allowList(req)
	g, err := h.Dispatcher.Acquire(ctx, t)
	if err != nil {
		// After the caller's own cancellation the loop may still read the
		// ticket; it and its buffer are left to the collector then.
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			recycleParsed(ps, t)
			putTicket(t)
		}
		return extproc.Decision{}, replyFor(err)
	}
	body := h.routed(req, t, g, ps)
	recycleParsed(ps, t)
	putTicket(t)
	return extproc.Decision{Endpoints: g.Endpoints, Body: body, Lifecycle: g}, nil
}

// tickets recycles tickets: the dispatcher is done with one once Acquire
// returned a grant or an error other than the caller's cancellation.
var tickets = sync.Pool{New: func() any { return new(dispatcher.Ticket) }}

func putTicket(t *dispatcher.Ticket) {
	*t = dispatcher.Ticket{}
	tickets.Put(t)
}

// allowList combines the subset hint and the conformance test header: a
// request may go only where both allow.
func allowList(req *extproc.Request) ([]string, bool) {
	switch {
	case req.HasSubset && req.TestEndpoints != nil:
		var both []string
		for _, s := range req.Subset {
			for _, e := range req.TestEndpoints {
				if matches(s, e) || matches(e, s) {
					both = append(both, longer(s, e))
				}
			}
		}
		if both == nil {
			both = []string{}
		}
		return both, true
	case req.HasSubset:
		if req.Subset == nil {
			return []string{}, true
		}
		return req.Subset, true
	case req.TestEndpoints != nil:
		return req.TestEndpoints, true
	}
	return nil, false
}

// matches reports whether entry a ("ip" or "ip:port") covers b.
func matches(a, b string) bool {
	return a == b || (!strings.Contains(a, ":") && strings.HasPrefix(b, a+":"))
}

func longer(a, b string) string {
	if len(b) > len(a) {
		return b
	}
	return a
}

// replyFor maps a dispatcher error to the client's answer (SPEC §5, §7).
// Context errors pass through: the gateway went away and nobody listens.
func replyFor(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var rej *drr.Rejection
	var shed *dispatcher.ShedError
	var none *dispatcher.NoEndpointError
	switch {
	case errors.As(err, &rej):
		return jsonReply(http.StatusTooManyRequests, "queue_limit", rej.Error(), map[string]any{
			"policy_class": rej.Class,
			"limit_kind":   string(rej.Kind),
			"current":      rej.Current,
			"limit":        rej.Limit,
		})
	case errors.As(err, &shed):
		return jsonReply(http.StatusTooManyRequests, "shed", shed.Error(), map[string]any{
			"policy_class":   shed.Class,
			"waited_seconds": shed.Waited.Seconds(),
			"budget_seconds": shed.Budget.Seconds(),
		})
	case errors.As(err, &none):
		return jsonReply(http.StatusServiceUnavailable, "no_endpoints", none.Error(), nil)
	case errors.Is(err, dispatcher.ErrShuttingDown):
		return jsonReply(http.StatusServiceUnavailable, "shutting_down", err.Error(), nil)
	}
	return jsonReply(http.StatusServiceUnavailable, "internal", "endpoint picker error", nil)
}

func jsonReply(status int, reason, msg string, details map[string]any) *extproc.Reply {
	body := map[string]any{"error": msg}
	if details != nil {
		body["details"] = details
	}
	b, _ := json.Marshal(body) // maps of strings and numbers always marshal
	return &extproc.Reply{Status: status, Reason: reason, Message: msg, Body: b}
}
