package epp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/fault"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// RequestParser turns a request into the parts of a ticket that come from
// its body and headers: model, prompt length and ordering hints. An error
// answers 400.
type RequestParser interface {
	Parse(req *extproc.Request, t *sched.Ticket) error
}

// Acquirer is the dispatcher as the handler uses it.
type Acquirer interface {
	Acquire(ctx context.Context, t *sched.Ticket) (*sched.Grant, error)
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
	// Identity, when set, returns the policy's identity source (SPEC §14)
	// for each request; nil or a nil answer means none.
	Identity func() *policy.Identity
	// IgnoreClientHints, without an identity source, makes every request
	// the anonymous tenant and drops its class and priority hints: a
	// client's x-laneway-tenant and hints count for nothing
	// (--trust-client-hints=false).
	IgnoreClientHints bool
	// WaitEstimate, when set, returns a class's current queue-wait
	// estimate, 0 when it has none: the retry-after of the class's 429s
	// (queue and tenant limits, shed). Answers without a class, or of a
	// class without an estimate, carry the server's --retry-after.
	WaitEstimate func(class string) time.Duration
}

var _ extproc.Decider = (*Handler)(nil)

// Decide implements extproc.Decider.
func (h *Handler) Decide(ctx context.Context, req *extproc.Request) (extproc.Decision, error) {
	fault.At("decide", req.Headers)
	if h.Gate != nil {
		if reason := h.Gate(); reason != "" {
			return extproc.Decision{}, jsonReply(http.StatusServiceUnavailable, reason, "this endpoint picker replica is not serving ("+reason+")", nil)
		}
	}
	t := tickets.Get().(*sched.Ticket)
	ps, err := h.parse(req, t)
	if err != nil {
		recycleParsed(ps, t)
		putTicket(t)
		return extproc.Decision{}, &extproc.Reply{Status: http.StatusBadRequest, Reason: "malformed_body", Message: err.Error()}
	}
	t.Allow, t.HasAllow = allowList(req)
	var id *policy.Identity
	if h.Identity != nil {
		id = h.Identity()
	}
	if h.IgnoreClientHints && id == nil {
		t.ClassHeader, t.Priority, t.HasPriority, t.Strict = "", 0, false, 0
	} else {
		t.Tenant = tenantOf(req, id)
	}
	if v, ok := req.Headers[policy.DPRankHeader]; ok {
		t.RankLo, t.RankHi, t.HasRanks = policy.ParseDPRank(v)
	}
	g, err := h.Dispatcher.Acquire(ctx, t)
	if err != nil {
		// After the caller's own cancellation the loop may still read the
		// ticket; it and its buffer are left to the collector then.
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			recycleParsed(ps, t)
			putTicket(t)
		}
		return extproc.Decision{}, h.replyFor(err)
	}
	// The grant must go back whatever happens before it is handed over:
	// a panic from here on would otherwise leave the endpoint charged
	// forever. The stream's own recovery answers the client.
	handed := false
	defer func() {
		if !handed {
			g.Done()
		}
	}()
	fault.At("after_grant", req.Headers)
	body := h.routed(req, t, g, ps)
	recycleParsed(ps, t)
	putTicket(t)
	handed = true
	dec := extproc.Decision{Endpoints: g.Endpoints, Body: body, Lifecycle: g}
	if p := g.Prefiller(); p != "" {
		// Disaggregated: the decode pod's sidecar prefills on this pod.
		dec.Headers = []extproc.Header{{Name: sched.PrefillerHeader, Value: p}}
	} else if _, ok := req.Headers[sched.PrefillerHeader]; ok {
		// A client must not choose a prefill pod (or make the sidecar
		// call any address it likes).
		dec.RemoveHeaders = []string{sched.PrefillerHeader}
	}
	return dec, nil
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
func (h *Handler) replyFor(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var rej *drr.Rejection
	var shed *sched.ShedError
	var none *sched.NoEndpointError
	var reply *extproc.Reply
	switch {
	case errors.As(err, &reply):
		return reply // the leader's own answer to a ticket (internal/ha)
	case errors.As(err, &rej):
		details := map[string]any{
			"policy_class": rej.Class,
			"limit_kind":   string(rej.Kind),
			"current":      rej.Current,
			"limit":        rej.Limit,
		}
		if rej.Tenant != "" { // a tenant's own limit, or the class's tenant bound
			details["tenant"] = rej.Tenant
		}
		return h.retryIn(rej.Class, jsonReply(http.StatusTooManyRequests, "queue_limit", rej.Error(), details))
	case errors.As(err, &shed):
		return h.retryIn(shed.Class, jsonReply(http.StatusTooManyRequests, "shed", shed.Error(), map[string]any{
			"policy_class":   shed.Class,
			"waited_seconds": shed.Waited.Seconds(),
			"budget_seconds": shed.Budget.Seconds(),
		}))
	case errors.As(err, &none):
		return jsonReply(http.StatusServiceUnavailable, "no_endpoints", none.Error(), nil)
	case errors.Is(err, sched.ErrShuttingDown):
		return jsonReply(http.StatusServiceUnavailable, "shutting_down", err.Error(), nil)
	}
	return jsonReply(http.StatusServiceUnavailable, "internal", "endpoint picker error", nil)
}

// retryIn sets r's retry-after to class's queue-wait estimate, when there
// is one. A client told to come back after about the time the class's
// queued requests now wait finds, on average, room made by the requests
// ahead of it; the median rather than a tail keeps the advice short
// enough to be followed.
func (h *Handler) retryIn(class string, r *extproc.Reply) *extproc.Reply {
	if h.WaitEstimate != nil {
		r.RetryAfter = h.WaitEstimate(class)
	}
	return r
}

func jsonReply(status int, reason, msg string, details map[string]any) *extproc.Reply {
	body := map[string]any{"error": msg}
	if details != nil {
		body["details"] = details
	}
	b, _ := json.Marshal(body) // maps of strings and numbers always marshal
	return &extproc.Reply{Status: status, Reason: reason, Message: msg, Body: b}
}

// tenantOf is the request's tenant identity (SPEC §14): from the
// identity source when the policy has one (the forwarded metadata field,
// then the gateway's header), else from the x-laneway-tenant header a
// client may set. "" when there is none; the policy names such requests'
// tenant. It is a name of its own (tenantName), never a piece of the
// request.
func tenantOf(req *extproc.Request, id *policy.Identity) string {
	if id == nil {
		return tenantName(strings.TrimSpace(req.Headers[policy.TenantHeader]))
	}
	if id.MetadataNamespace != "" {
		if v, ok := req.MetadataString(id.MetadataNamespace, id.MetadataPath); ok && v != "" {
			return tenantName(v)
		}
	}
	if id.Header != "" {
		return tenantName(strings.TrimSpace(req.Headers[id.Header]))
	}
	return ""
}

// MaxTenantBytes bounds a tenant's name, as Kubernetes bounds an object's.
const MaxTenantBytes = 253

// tenantName is the name an identity is kept under, in a queue and for
// the status page's minute: a copy, because a header value is a slice of
// the string that holds all of a request's header values, which the name
// would otherwise keep alive (16 KiB of headers per tenant kept for a
// name of a few bytes), and at most MaxTenantBytes long. A longer identity
// keeps its first bytes (at a character boundary) and ends in "~" and 16
// hex digits of its SHA-256, so two long identities stay two tenants,
// and a binding's prefix of up to 236 bytes still matches.
func tenantName(id string) string {
	if len(id) <= MaxTenantBytes {
		return strings.Clone(id)
	}
	sum := sha256.Sum256([]byte(id))
	const suffix = 1 + 16
	cut := MaxTenantBytes - suffix
	for cut > 0 && !utf8.RuneStart(id[cut]) {
		cut--
	}
	return id[:cut] + "~" + hex.EncodeToString(sum[:8])
}

// cachedEstimate wraps a class's queue-wait estimate read so that each
// class is read at most once per ttl. The status tracker's read walks the
// class's last minute and every tenant in it, which a storm of 429s would
// otherwise repeat for each rejection, holding the lock the dispatcher
// loop records under; an estimate up to ttl old is as good an advice for a
// retry given in whole seconds.
func cachedEstimate(read func(class string) time.Duration, ttl time.Duration, now func() time.Time) func(string) time.Duration {
	type entry struct {
		at  time.Time
		est time.Duration
	}
	var mu sync.Mutex
	cache := map[string]entry{}
	return func(class string) time.Duration {
		t := now()
		mu.Lock()
		defer mu.Unlock()
		if e, ok := cache[class]; ok && t.Sub(e.at) < ttl {
			return e.est
		}
		e := entry{at: t, est: read(class)}
		cache[class] = e
		return e.est
	}
}
