package controller

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// PolicySink receives validated policies (the dispatcher): queued requests
// are re-resolved and keep their order.
type PolicySink interface {
	SetPolicy(p *sched.Policy) error
}

// PoolRef identifies the pool whose policy objects count.
type PoolRef struct {
	Group string
	types.NamespacedName
}

// refersTo reports whether a policy object's poolRef names the pool.
func (p PoolRef) refersTo(r v1alpha1.PoolReference) bool {
	g := r.Group
	if g == "" {
		g = v1alpha1.DefaultPoolGroup
	}
	return g == p.Group && r.Name == p.Name
}

// PoolObjects selects the pool's policy objects from all of a namespace's.
func PoolObjects(pool PoolRef, profiles []v1alpha1.PolicyProfile, classes []v1alpha1.PolicyClass) ([]v1alpha1.PolicyProfile, []v1alpha1.PolicyClass) {
	var ps []v1alpha1.PolicyProfile
	for i := range profiles {
		if pool.refersTo(profiles[i].Spec.PoolRef) {
			ps = append(ps, profiles[i])
		}
	}
	var cs []v1alpha1.PolicyClass
	for i := range classes {
		if pool.refersTo(classes[i].Spec.PoolRef) {
			cs = append(cs, classes[i])
		}
	}
	return ps, cs
}

// Verdict is the policy controller's judgement of the pool's objects at one
// resync: each object's Accepted condition (ObservedGeneration set to the
// generation judged). The status writer publishes it.
type Verdict struct {
	Conditions map[policy.ObjectRef]metav1.Condition
	// Tenants describes the tenant rules of the policy in force, for the
	// PolicyProfile's status; nil before any policy was applied.
	Tenants *TenantSummary
}

// TenantSummary is what a PolicyProfile's status says about the tenant
// rules in force (the Identity and Tenants columns).
type TenantSummary struct {
	Identity string
	Bindings int64
}

// summarizeTenants describes cfg's tenant rules in a column's width.
func summarizeTenants(cfg *policy.Config) *TenantSummary {
	if cfg == nil {
		return nil
	}
	out := &TenantSummary{Identity: "none (client hints trusted)", Bindings: int64(len(cfg.Tenants))}
	if id := cfg.Identity; id != nil {
		out.Identity = id.Sources()
	}
	return out
}

// policyReconciler validates the pool's whole object set on any change of
// one of them and applies it when valid and different from the policy in
// force.
type policyReconciler struct {
	reader  client.Reader
	pool    PoolRef
	sink    PolicySink
	publish func(Verdict)
	log     logr.Logger
	synced  func()
	// accepted is called after every resync with its verdict: true when
	// the objects were valid and their set is in force, false when they
	// were rejected.
	accepted func(ok bool)

	// Owned by the reconcile goroutine.
	applied *policy.Config // nil until a set of objects was applied
	invalid string         // the last invalid set's error, logged once
}

// Reconcile implements reconcile.Reconciler.
func (r *policyReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var pl v1alpha1.PolicyProfileList
	if err := r.reader.List(ctx, &pl, client.InNamespace(r.pool.Namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("list PolicyProfiles in %s: %w", r.pool.Namespace, err)
	}
	var cl v1alpha1.PolicyClassList
	if err := r.reader.List(ctx, &cl, client.InNamespace(r.pool.Namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("list PolicyClasses in %s: %w", r.pool.Namespace, err)
	}
	profiles, classes := PoolObjects(r.pool, pl.Items, cl.Items)
	check := policy.CheckObjects(profiles, classes)

	if check.Config != nil {
		if err := r.apply(check.Config); err != nil {
			return reconcile.Result{}, err
		}
		r.invalid = ""
	} else if msg := check.Problems.Error(); msg != r.invalid {
		r.invalid = msg
		if r.applied == nil {
			// Nothing valid was ever read: the replica does not serve
			// (503 policy_invalid) until the objects are fixed. An error,
			// for whoever watches the logs.
			r.log.Error(errors.New(msg), "policy objects rejected and no valid policy was ever applied: not ready (policy_invalid) until they are fixed",
				"pool", r.pool.Name, "problems", len(check.Problems))
		} else {
			// An operator's mistake, not the picker's: Info, without the
			// stack trace an Error carries; the conditions say it too.
			r.log.Info("policy objects rejected; the last valid policy stays in force",
				"pool", r.pool.Name, "problems", len(check.Problems), "error", msg)
		}
	}
	r.accepted(check.Config != nil)

	// Conditions go out only now: Accepted=True means "in force".
	v := Verdict{Conditions: make(map[policy.ObjectRef]metav1.Condition, len(profiles)+len(classes)), Tenants: summarizeTenants(r.applied)}
	for i := range profiles {
		ref := policy.ObjectRef{Kind: policy.KindPolicyProfile, Name: profiles[i].Name}
		v.Conditions[ref] = check.AcceptedCondition(ref, profiles[i].Generation)
	}
	for i := range classes {
		ref := policy.ObjectRef{Kind: policy.KindPolicyClass, Name: classes[i].Name}
		v.Conditions[ref] = check.AcceptedCondition(ref, classes[i].Generation)
	}
	r.publish(v)
	r.synced()
	return reconcile.Result{}, nil
}

// apply compiles cfg and hands it to the dispatcher unless it equals the
// policy in force (a swap re-resolves every queued request, so an event
// that changes nothing, such as a new label, must not cause one).
func (r *policyReconciler) apply(cfg *policy.Config) error {
	if r.applied != nil && reflect.DeepEqual(r.applied, cfg) {
		return nil
	}
	compiled, err := cfg.Compile()
	if err != nil {
		// CheckObjects validated cfg with the same rules; this is a bug.
		return fmt.Errorf("compile the policy of pool %s: %w", r.pool.Name, err)
	}
	if err := r.sink.SetPolicy(sched.FromCompiled(compiled)); err != nil {
		return fmt.Errorf("apply the policy of pool %s: %w", r.pool.Name, err)
	}
	r.applied = cfg
	r.log.Info("policy applied", "pool", r.pool.Name, "classes", len(compiled.Classes), "tenants", compiled.Identity().String())
	for i, in := range compiled.Info {
		r.log.V(2).Info("policy class", "model", in.Model, "class", in.Name, "quantum", compiled.Classes[i].Quantum,
			"policy", compiled.Classes[i].Policy.String(), "busy", compiled.Busy[i].String(), "synthetic", in.Synthetic)
	}
	return nil
}
