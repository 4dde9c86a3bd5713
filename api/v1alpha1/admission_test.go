package v1alpha1_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"

	"github.com/laneway-dev/laneway/api/v1alpha1"
)

func ptr[T any](v T) *T { return &v }

func validClass(ns, name string) *v1alpha1.PolicyClass {
	return &v1alpha1.PolicyClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.PolicyClassSpec{
			PoolRef: v1alpha1.PoolReference{Name: "llm"},
			Quantum: 512,
		},
	}
}

// TestPolicyClassAdmission checks the per-object rules the CRD enforces:
// each invalid object is refused with a message naming the field and rule.
func TestPolicyClassAdmission(t *testing.T) {
	needAPIServer(t)
	ns := namespace(t)
	tests := []struct {
		name string
		mut  func(*v1alpha1.PolicyClassSpec)
		want []string // substrings of the refusal, all required
	}{
		{"quantum 0", func(s *v1alpha1.PolicyClassSpec) { s.Quantum = 0 },
			[]string{"spec.quantum", "should be greater than or equal to 1"}},
		{"negative quantum", func(s *v1alpha1.PolicyClassSpec) { s.Quantum = -1 },
			[]string{"spec.quantum", "should be greater than or equal to 1"}},
		{"unknown queue policy", func(s *v1alpha1.PolicyClassSpec) { s.QueuePolicy = "lifo" },
			[]string{`spec.queuePolicy: Unsupported value: "lifo": supported values: "fcfs", "wspt", "edf"`}},
		{"malformed class name", func(s *v1alpha1.PolicyClassSpec) { s.ClassName = "gold class" },
			[]string{`spec.className: Invalid value: "gold class"`, "should match '^[A-Za-z0-9_.-]+$'"}},
		{"family without bucket", func(s *v1alpha1.PolicyClassSpec) { s.PolicyFamily = "standard" },
			[]string{"policyFamily and cacheBucket must be set together: both for a family class, neither for an explicit class"}},
		{"bucket without family", func(s *v1alpha1.PolicyClassSpec) { s.CacheBucket = "cached" },
			[]string{"policyFamily and cacheBucket must be set together"}},
		{"ratio above 1", func(s *v1alpha1.PolicyClassSpec) {
			s.PrefillBusyThreshold, s.BusyWorkerRatio = ptr(intstr.FromInt32(1)), ptr("1.5")
		}, []string{"spec.busyWorkerRatio", "busyWorkerRatio must be greater than 0 and at most 1"}},
		{"ratio 0", func(s *v1alpha1.PolicyClassSpec) {
			s.PrefillBusyThreshold, s.BusyWorkerRatio = ptr(intstr.FromInt32(1)), ptr("0")
		}, []string{"busyWorkerRatio must be greater than 0 and at most 1"}},
		{"ratio not a number", func(s *v1alpha1.PolicyClassSpec) {
			s.PrefillBusyThreshold, s.BusyWorkerRatio = ptr(intstr.FromInt32(1)), ptr("half")
		}, []string{`spec.busyWorkerRatio: Invalid value: "half"`, "should match"}},
		{"ratio without threshold", func(s *v1alpha1.PolicyClassSpec) { s.BusyWorkerRatio = ptr("0.5") },
			[]string{"busyWorkerRatio needs a busy threshold: set prefillBusyThreshold or prefillBusyThresholdFrac too"}},
		{"negative frac", func(s *v1alpha1.PolicyClassSpec) { s.PrefillBusyThresholdFrac = ptr("-1") },
			[]string{`spec.prefillBusyThresholdFrac: Invalid value: "-1"`, "should match"}},
		{"negative threshold", func(s *v1alpha1.PolicyClassSpec) { s.PrefillBusyThreshold = ptr(intstr.FromInt32(-1)) },
			[]string{"spec.prefillBusyThreshold", "should be greater than or equal to 0"}},
		{"negative limit", func(s *v1alpha1.PolicyClassSpec) { s.RequestQueueLimitPerWorker = ptr[int64](-1) },
			[]string{"spec.requestQueueLimitPerWorker", "should be greater than or equal to 0"}},
		{"negative max queue wait", func(s *v1alpha1.PolicyClassSpec) { s.MaxQueueWait = &metav1.Duration{Duration: -time.Second} },
			[]string{`spec.maxQueueWait: Invalid value: "-1s"`, "should match"}},
		{"no pool", func(s *v1alpha1.PolicyClassSpec) { s.PoolRef.Name = "" },
			[]string{"spec.poolRef.name", "should be at least 1 chars long"}},
		{"maxTenants without tenantFairness", func(s *v1alpha1.PolicyClassSpec) { s.MaxTenants = ptr[int64](10) },
			[]string{"maxTenants needs tenantFairness: true"}},
		{"maxTenants 0", func(s *v1alpha1.PolicyClassSpec) { s.TenantFairness, s.MaxTenants = true, ptr[int64](0) },
			[]string{"spec.maxTenants", "should be greater than or equal to 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := validClass(ns, "c")
			tt.mut(&obj.Spec)
			mustRefuse(t, obj, obj.Spec, tt.want)
		})
	}
}

// TestPolicyClassAccepted checks that valid objects are admitted, get their
// defaults, and that poolRef cannot change.
func TestPolicyClassAccepted(t *testing.T) {
	needAPIServer(t)
	ctx := context.Background()
	ns := namespace(t)
	full := validClass(ns, "full")
	full.Spec = v1alpha1.PolicyClassSpec{
		PoolRef: v1alpha1.PoolReference{Name: "llm"}, Model: "meta-llama/Llama-3.1-8B-Instruct", ClassName: "Gold_1.x",
		PolicyFamily: "gold", CacheBucket: "all", QueuePolicy: v1alpha1.QueuePolicyWSPT, Quantum: 4096,
		PrefillBusyThreshold: ptr(intstr.FromInt32(0)), PrefillBusyThresholdFrac: ptr("1.5e0"), BusyWorkerRatio: ptr("1"),
		RequestQueueLimitPerWorker: ptr[int64](0), RawISLTokenQueueLimitPerWorker: ptr[int64](1 << 40),
		CachedTokenQueueLimitPerWorker: ptr[int64](7), MaxQueueWait: &metav1.Duration{Duration: 90 * time.Second},
		TenantFairness: true, MaxTenants: ptr[int64](50),
	}
	minimal := validClass(ns, "minimal")
	for _, obj := range []*v1alpha1.PolicyClass{full, minimal} {
		if err := k8s.Create(ctx, obj); err != nil {
			t.Fatalf("create %s: %v", obj.Name, err)
		}
	}
	if minimal.Spec.QueuePolicy != v1alpha1.QueuePolicyEDF || minimal.Spec.PoolRef.Group != v1alpha1.DefaultPoolGroup {
		t.Errorf("defaults not applied: %+v", minimal.Spec)
	}
	if full.Spec.MaxQueueWait.Duration != 90*time.Second || *full.Spec.BusyWorkerRatio != "1" || !full.Spec.TenantFairness || *full.Spec.MaxTenants != 50 {
		t.Errorf("values changed: %+v", full.Spec)
	}
	if minimal.EffectiveClassName() != "minimal" || full.EffectiveClassName() != "Gold_1.x" {
		t.Errorf("EffectiveClassName: %q, %q", minimal.EffectiveClassName(), full.EffectiveClassName())
	}

	moved := minimal.DeepCopy()
	moved.Spec.PoolRef.Name = "other"
	if err := k8s.Update(ctx, moved); err == nil || !strings.Contains(err.Error(), "poolRef is immutable; create a new PolicyClass for another pool") {
		t.Errorf("moving a class to another pool: %v", err)
	}
	tuned := minimal.DeepCopy()
	tuned.Spec.Quantum = 128
	if err := k8s.Update(ctx, tuned); err != nil {
		t.Errorf("updating quantum: %v", err)
	}
}

// TestPolicyProfileAdmission checks the bucket and pairing rules.
func TestPolicyProfileAdmission(t *testing.T) {
	needAPIServer(t)
	ns := namespace(t)
	buckets := func(bs ...v1alpha1.CacheBucket) []v1alpha1.CacheBucket { return bs }
	tests := []struct {
		name string
		spec v1alpha1.PolicyProfileSpec
		want []string
	}{
		{"first bucket not at 0", v1alpha1.PolicyProfileSpec{DefaultPolicyFamily: "f", UncachedISLBuckets: buckets(v1alpha1.CacheBucket{Name: "a", MinTokens: 5})},
			[]string{"spec.uncachedISLBuckets", "the first bucket of uncachedISLBuckets must have minTokens 0"}},
		{"not increasing", v1alpha1.PolicyProfileSpec{DefaultPolicyFamily: "f", UncachedISLBuckets: buckets(
			v1alpha1.CacheBucket{Name: "a", MinTokens: 0}, v1alpha1.CacheBucket{Name: "b", MinTokens: 100}, v1alpha1.CacheBucket{Name: "c", MinTokens: 50})},
			[]string{"uncachedISLBuckets minTokens must be strictly increasing"}},
		{"equal bounds", v1alpha1.PolicyProfileSpec{DefaultPolicyFamily: "f", UncachedISLBuckets: buckets(
			v1alpha1.CacheBucket{Name: "a", MinTokens: 0}, v1alpha1.CacheBucket{Name: "b", MinTokens: 0})},
			[]string{"uncachedISLBuckets minTokens must be strictly increasing"}},
		{"bucket names repeat", v1alpha1.PolicyProfileSpec{DefaultPolicyFamily: "f", UncachedISLBuckets: buckets(
			v1alpha1.CacheBucket{Name: "a", MinTokens: 0}, v1alpha1.CacheBucket{Name: "a", MinTokens: 10})},
			[]string{"spec.uncachedISLBuckets[1]: Duplicate value"}},
		{"family without buckets", v1alpha1.PolicyProfileSpec{DefaultPolicyFamily: "f"},
			[]string{"defaultPolicyFamily and uncachedISLBuckets go together"}},
		{"buckets without family", v1alpha1.PolicyProfileSpec{UncachedISLBuckets: buckets(v1alpha1.CacheBucket{Name: "a"})},
			[]string{"defaultPolicyFamily and uncachedISLBuckets go together"}},
		{"model profile rules", v1alpha1.PolicyProfileSpec{Models: []v1alpha1.ModelProfile{{Model: "m", DefaultPolicyFamily: "f",
			UncachedISLBuckets: buckets(v1alpha1.CacheBucket{Name: "a", MinTokens: 1})}}},
			[]string{"spec.models[0].uncachedISLBuckets", "the first bucket of uncachedISLBuckets must have minTokens 0"}},
		{"model listed twice", v1alpha1.PolicyProfileSpec{Models: []v1alpha1.ModelProfile{{Model: "m"}, {Model: "m"}}},
			[]string{"spec.models[1]: Duplicate value"}},
		{"malformed default class", v1alpha1.PolicyProfileSpec{DefaultPolicyClass: "a b"},
			[]string{"spec.defaultPolicyClass", "should match"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := &v1alpha1.PolicyProfile{ObjectMeta: metav1.ObjectMeta{Name: "llm", Namespace: ns}, Spec: tt.spec}
			obj.Spec.PoolRef = v1alpha1.PoolReference{Name: "llm"}
			mustRefuse(t, obj, obj.Spec, tt.want)
		})
	}
	ok := &v1alpha1.PolicyProfile{ObjectMeta: metav1.ObjectMeta{Name: "llm", Namespace: ns}, Spec: v1alpha1.PolicyProfileSpec{
		PoolRef: v1alpha1.PoolReference{Name: "llm"}, DefaultPolicyFamily: "standard",
		UncachedISLBuckets: buckets(v1alpha1.CacheBucket{Name: "cached", MinTokens: 0}, v1alpha1.CacheBucket{Name: "uncached", MinTokens: 3072}),
		Models:             []v1alpha1.ModelProfile{{Model: "m", DefaultPolicyClass: "gold"}},
	}}
	if err := k8s.Create(context.Background(), ok); err != nil {
		t.Fatalf("valid PolicyProfile refused: %v", err)
	}
}

// TestPrinterColumns reads the PolicyClass list as kubectl does (a Table)
// and checks the columns and one row, status included.
func TestPrinterColumns(t *testing.T) {
	needAPIServer(t)
	ctx := context.Background()
	ns := namespace(t)
	obj := validClass(ns, "premium")
	obj.Spec.PolicyFamily, obj.Spec.CacheBucket, obj.Spec.QueuePolicy = "premium", "all", v1alpha1.QueuePolicyFCFS
	obj.Spec.PrefillBusyThreshold = ptr(intstr.FromInt32(1536))
	if err := k8s.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	obj.Status.Pending = 3
	obj.Status.ObservedGeneration = obj.Generation
	obj.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted,
		Message: "ok", LastTransitionTime: metav1.Now(), ObservedGeneration: obj.Generation}}
	if err := k8s.Status().Update(ctx, obj); err != nil {
		t.Fatalf("status update: %v", err)
	}

	checkTable(t, ns, "policyclasses",
		[]string{"Name", "Family", "Bucket", "Policy", "Quantum", "Threshold", "Accepted", "Pending", "Age"},
		map[string]any{"Name": "premium", "Family": "premium", "Bucket": "all", "Policy": "fcfs",
			"Quantum": float64(512), "Threshold": float64(1536), "Accepted": "True", "Pending": float64(3), "Tenant Fair": nil})
}

// checkTable reads the one object of resource in ns as kubectl does (a
// Table) and checks the default columns (priority 0) and the row's cells
// (all columns; nil for an empty cell).
func checkTable(t *testing.T, ns, resource string, wantCols []string, want map[string]any) {
	t.Helper()
	ctx := context.Background()
	hc, err := rest.HTTPClientFor(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(restCfg.Host, "/")+"/apis/laneway.dev/v1alpha1/namespaces/"+ns+"/"+resource, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s table: %d %v %s", req.URL, resp.StatusCode, err, body)
	}
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		if c.Priority == 0 {
			cols = append(cols, c.Name)
		}
	}
	if strings.Join(cols, ",") != strings.Join(wantCols, ",") {
		t.Errorf("%s default columns = %v, want %v", resource, cols, wantCols)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("%s: %d rows, want 1", resource, len(table.Rows))
	}
	row := map[string]any{}
	for i, c := range table.ColumnDefinitions {
		row[c.Name] = table.Rows[0].Cells[i]
	}
	for k, v := range want {
		if row[k] != v {
			t.Errorf("%s column %s = %v (%T), want %v", resource, k, row[k], row[k], v)
		}
	}
}
