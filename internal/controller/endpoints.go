package controller

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"github.com/laneway-dev/laneway/pkg/sched"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// Pod annotations the endpoint controller reads.
const (
	// AnnotationActivePorts narrows a pod's endpoints to some of the pool's
	// target ports: a comma list of port numbers (upstream convention, for
	// data-parallel ranks that are not all up). Entries that are not target
	// ports are ignored; present with no valid entry means no endpoint.
	AnnotationActivePorts = "inference.networking.k8s.io/active-ports"
	// AnnotationTaint with value TaintNoSchedule keeps a pod's endpoints but
	// takes them out of unpinned scheduling (SPEC §5): requests pinned to
	// them are still served, for example while the pod is being drained.
	AnnotationTaint = "laneway.dev/taint"
	// TaintNoSchedule is the AnnotationTaint value that taints.
	TaintNoSchedule = "NoSchedule"
	// AnnotationMaxBatchedTokens overrides --max-num-batched-tokens for one
	// pod (its engine's max_num_batched_tokens, which
	// prefill_busy_threshold_frac multiplies).
	AnnotationMaxBatchedTokens = "laneway.dev/max-num-batched-tokens"
)

// EndpointSink receives full endpoint snapshots (the dispatcher).
type EndpointSink interface {
	SetEndpoints(eps []sched.Endpoint)
}

// Endpoints computes a pool's endpoint set from its pods (already selected
// by the pool's selector): one endpoint per active target port of each pod
// that is Ready, has an IP and exists. The set is sorted by address.
//
// Membership follows what a request pinned to the endpoint should get:
//   - not Ready, no IP, or gone: no endpoint, so a request pinned to it is
//     answered 503 at once instead of being sent to a server that cannot
//     answer;
//   - Ready but being deleted (graceful termination) or annotated
//     laneway.dev/taint: NoSchedule: a Tainted endpoint, which takes no new
//     unpinned requests but still serves pinned ones while it drains
//     (SPEC §5).
//
// defaultMax is the max_num_batched_tokens of pods without the
// laneway.dev/max-num-batched-tokens annotation. roleLabel is the label key
// that gives a pod's role in a disaggregated pool (DefaultRoleLabel unless
// configured); a pod without it is prefill-decode. Each problem with an
// annotation is reported through bad, and the annotation is then ignored;
// an unknown role is reported through badRole (the pod serves as
// prefill-decode).
func Endpoints(pool *inferencev1.InferencePool, pods []corev1.Pod, defaultMax uint64, roleLabel string, bad, badRole func(pod string, err error)) []sched.Endpoint {
	var eps []sched.Endpoint
	for i := range pods {
		p := &pods[i]
		if p.Status.PodIP == "" || !podReady(p) {
			continue
		}
		ports, err := activePorts(p, pool.Spec.TargetPorts)
		if err != nil && bad != nil {
			bad(p.Name, err)
		}
		maxTok := defaultMax
		if v, ok := p.Annotations[AnnotationMaxBatchedTokens]; ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil || n == 0 {
				if bad != nil {
					bad(p.Name, fmt.Errorf("annotation %s=%q is not a positive integer; using %d", AnnotationMaxBatchedTokens, v, defaultMax))
				}
			} else {
				maxTok = n
			}
		}
		tainted := p.DeletionTimestamp != nil || strings.TrimSpace(p.Annotations[AnnotationTaint]) == TaintNoSchedule
		role, err := sched.ParseRole(p.Labels[roleLabel])
		if err != nil && badRole != nil {
			badRole(p.Name, fmt.Errorf("label %s: %w", roleLabel, err))
		}
		for _, port := range ports {
			eps = append(eps, sched.Endpoint{
				Addr: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port))),
				// Each target port is one data-parallel rank, counted in
				// the pool's order (SPEC §5), whether or not it is active.
				Rank:             slices.IndexFunc(pool.Spec.TargetPorts, func(t inferencev1.Port) bool { return t.Number == port }),
				MaxBatchedTokens: maxTok,
				Tainted:          tainted,
				// The upstream engine-type label picks the metrics mapping
				// (SPEC §9); empty falls back to --engine-type.
				Engine: p.Labels[LabelEngineType],
				Role:   role,
			})
		}
	}
	slices.SortFunc(eps, func(a, b sched.Endpoint) int { return strings.Compare(a.Addr, b.Addr) })
	// Two pods cannot share an IP, but a pod listing a port twice could
	// make a duplicate; the dispatcher keys endpoints by address.
	return slices.CompactFunc(eps, func(a, b sched.Endpoint) bool { return a.Addr == b.Addr })
}

// LabelEngineType is the upstream pod label naming a model server's engine
// (vllm, sglang, trtllm).
const LabelEngineType = "inference.networking.k8s.io/engine-type"

// DefaultRoleLabel is the pod label that gives a pod's role in a
// disaggregated prefill/decode pool (prefill, decode, prefill-decode, or
// the deprecated both), llm-d's convention; --role-label overrides the key.
const DefaultRoleLabel = "llm-d.ai/role"

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// activePorts is the pool's target ports, narrowed by the pod's
// active-ports annotation when it has one. The error names malformed or
// foreign entries (which are skipped).
func activePorts(p *corev1.Pod, target []inferencev1.Port) ([]inferencev1.PortNumber, error) {
	all := make([]inferencev1.PortNumber, 0, len(target))
	for _, t := range target {
		all = append(all, t.Number)
	}
	v, ok := p.Annotations[AnnotationActivePorts]
	if !ok {
		return all, nil
	}
	active := map[inferencev1.PortNumber]bool{}
	var skipped []string
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 32)
		if err != nil || !slices.Contains(all, inferencev1.PortNumber(n)) {
			skipped = append(skipped, strconv.Quote(f))
			continue
		}
		active[inferencev1.PortNumber(n)] = true
	}
	out := all[:0]
	for _, n := range all {
		if active[n] {
			out = append(out, n)
		}
	}
	if len(skipped) > 0 {
		return out, fmt.Errorf("annotation %s=%q: %s are not target ports of the pool; ignored", AnnotationActivePorts, v, strings.Join(skipped, ", "))
	}
	return out, nil
}

// endpointReconciler recomputes the whole endpoint set on any event of the
// pool or its pods. Every event maps to the pool's key, and the work queue
// holds a key once, so a burst of events is one resync; an unchanged set
// is not pushed.
type endpointReconciler struct {
	reader     client.Reader
	pool       types.NamespacedName
	defaultMax uint64
	roleLabel  string
	sink       EndpointSink
	log        logr.Logger
	synced     func()

	// Owned by the reconcile goroutine (MaxConcurrentReconciles is 1).
	last    []sched.Endpoint
	pushed  bool
	missing bool // the pool did not exist at the last resync (logged once)
	// badRoles are the pods whose unknown role label was logged, with the
	// message: each is logged once per value, not at every resync.
	badRoles map[string]string
}

// Reconcile implements reconcile.Reconciler.
func (r *endpointReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var pool inferencev1.InferencePool
	var eps []sched.Endpoint
	switch err := r.reader.Get(ctx, r.pool, &pool); {
	case apierrors.IsNotFound(err):
		if !r.missing {
			r.log.Info("InferencePool not found; the pool has no endpoints until it exists", "pool", r.pool.String())
		}
		r.missing = true
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("get InferencePool %s: %w", r.pool, err)
	default:
		r.missing = false
		sel := poolSelector(&pool)
		var pods corev1.PodList
		if sel != nil {
			if err := r.reader.List(ctx, &pods, client.InNamespace(r.pool.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
				return reconcile.Result{}, fmt.Errorf("list pods of InferencePool %s: %w", r.pool, err)
			}
		}
		seen := map[string]string{}
		eps = Endpoints(&pool, pods.Items, r.defaultMax, r.roleLabel, func(pod string, err error) {
			r.log.V(3).Info("pod annotation ignored", "pod", pod, "reason", err.Error())
		}, func(pod string, err error) {
			seen[pod] = err.Error()
			if r.badRoles[pod] != err.Error() {
				r.log.Info("warning: pod role label not understood", "pod", pod, "reason", err.Error())
			}
		})
		r.badRoles = seen
	}
	if r.pushed && slices.Equal(eps, r.last) {
		return reconcile.Result{}, nil
	}
	r.sink.SetEndpoints(eps)
	tainted := 0
	for _, e := range eps {
		if e.Tainted {
			tainted++
		}
	}
	r.log.V(2).Info("endpoints changed", "pool", r.pool.String(), "endpoints", len(eps), "tainted", tainted)
	if r.log.V(3).Enabled() {
		addrs := make([]string, len(eps))
		for i, e := range eps {
			addrs[i] = e.Addr
		}
		r.log.V(3).Info("endpoint set", "addresses", addrs)
	}
	r.last, r.pushed = eps, true
	r.synced()
	return reconcile.Result{}, nil
}

// poolSelector is the pool's pod selector; nil for an empty one, which
// selects no pod (the CRD requires at least one label, so an empty selector
// is a broken object, not "every pod of the namespace").
func poolSelector(pool *inferencev1.InferencePool) labels.Selector {
	if len(pool.Spec.Selector.MatchLabels) == 0 {
		return nil
	}
	set := make(labels.Set, len(pool.Spec.Selector.MatchLabels))
	for k, v := range pool.Spec.Selector.MatchLabels {
		set[string(k)] = string(v)
	}
	return labels.SelectorFromValidatedSet(set)
}
