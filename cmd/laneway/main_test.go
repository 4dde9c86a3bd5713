package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/internal/testbed/testenv"
	"github.com/laneway-dev/laneway/pkg/policy"
)

const samples = "../../config/samples"

var sampleNames = []string{"cache-buckets", "premium-regular", "single-class", "models", "tenants"}

// noIdentity is the line validate ends with for a policy without identity.
const noIdentity = "no identity configured: the x-laneway-tenant header names the tenant and client hints are trusted as sent\n"

// runCLI runs the command in-process and returns its exit code and output.
func runCLI(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		code     int
		stdout   string
		stderrIn []string
	}{
		{
			name: "cache buckets sample",
			args: []string{"validate", filepath.Join(samples, "policy-cache-buckets.yaml")},
			code: 0,
			stdout: `class "cached": family standard, bucket cached (uncached >= 0), policy wspt, quantum 2048, no busy threshold (never queues)
class "uncached": family standard, bucket uncached (uncached >= 3072), policy fcfs, quantum 512, no busy threshold (never queues)
` + noIdentity,
		},
		{
			name: "premium regular sample",
			args: []string{"validate", filepath.Join(samples, "policy-premium-regular.yaml")},
			code: 0,
			stdout: `class "premium": family premium, bucket all (uncached >= 0), policy fcfs, quantum 512, threshold 1536 tokens, limit requests 1024/worker
class "regular": family regular, bucket all (uncached >= 0), policy fcfs, quantum 128, threshold 1536 tokens, limit requests 1024/worker
` + noIdentity,
		},
		{
			name:   "no policy",
			args:   []string{"validate", "EMPTY"},
			code:   0,
			stdout: "class \"default\": synthetic (no policy classes), policy fcfs, quantum 1, no busy threshold (never queues)\n" + noIdentity,
		},
		{
			name: "tenants sample",
			args: []string{"validate", filepath.Join(samples, "policy-tenants.yaml")},
			code: 0,
			stdout: `class "premium-short": family premium, bucket short (uncached >= 0), policy edf, quantum 512, threshold 1536 tokens
class "premium-long": family premium, bucket long (uncached >= 3072), policy edf, quantum 512, threshold 1536 tokens
class "regular-short": family regular, bucket short (uncached >= 0), policy edf, quantum 128, threshold 1536 tokens, tenant-fair (at most 10000 tenants)
class "regular-long": family regular, bucket long (uncached >= 3072), policy edf, quantum 128, threshold 1536 tokens, tenant-fair (at most 50 tenants)
tenant "acme": identities acme, acme-batch, acme-*; allowed premium, regular (default regular); weight 3; caps priority 10, strict 1; limits 500 requests, 2000000 raw_isl_tokens per class
tenant "acme-x": identities acme-x; allowed premium (default premium); weight 1; caps priority 0, strict 0; never matches: tenant "acme" comes first for every identity it selects
default tenant: allowed regular (default regular); weight 1; caps priority 0, strict 0
identity from metadata envoy.filters.http.jwt_authn/my-provider.sub, then header x-tenant-id; requests without one are tenant "nobody"
`,
		},
		{
			name: "tenants without identity: uncapped, header-named",
			args: []string{"validate", "TENANTS"},
			code: 0,
			stdout: `class "a": explicit, policy fcfs, quantum 1, threshold 10 tokens, tenant-fair (at most 10000 tenants)
tenant "batch": identities batch-*; any class; weight 1; caps priority none, strict 2; limits 7 requests per class
` + noIdentity,
		},
		{
			name: "tenant problems, one per line",
			args: []string{"validate", "BADTENANTS"},
			code: 1,
			stderrIn: []string{
				"4 problem(s):\n",
				"\nidentity.header \"X-Tenant\" must be a lower-case header name\n",
				"\ntenant \"t\": allowed \"gold\" names no policy family or explicit class\n",
				"\ntenant \"t\": default_family \"gold\" names no policy family or explicit class\n",
				"\ndefault_tenant: weight must be between 1 and 1000000 (got 0)\n",
			},
		},
		{
			name: "every error, one per line",
			args: []string{"validate", "INVALID"},
			code: 1,
			stderrIn: []string{
				"2 problem(s):\n",
				"\nclass \"a\": quantum must be > 0 (got 0)\n",
				"\npolicy family \"f\" has no class for cache bucket \"b\"\n",
			},
		},
		{"missing file", []string{"validate", "/nonexistent/policy.yaml"}, 1, "", []string{"laneway: read policy file: open /nonexistent/policy.yaml"}},
		{"no file argument", []string{"validate"}, 2, "", []string{"usage:"}},
		{"two file arguments", []string{"validate", "a", "b"}, 2, "", []string{"usage:"}},
		{"unknown command", []string{"frobnicate"}, 2, "", []string{`unknown command "frobnicate"`}},
		{"no command", nil, 2, "", []string{"usage:"}},
		{"help", []string{"help"}, 0, usage, nil},
	}
	empty := writeFile(t, "")
	invalid := writeFile(t, `
default_policy_family: f
uncached_isl_buckets: [{min_tokens: 0, bucket: a}, {min_tokens: 10, bucket: b}]
policy_classes: [{name: a, policy_family: f, cache_bucket: a, quantum: 0}]
`)
	tenants := writeFile(t, `
tenants: [{name: batch, match: {prefix: [batch-]}, max_strict_priority: 2, request_queue_limit: 7}]
policy_classes: [{name: a, quantum: 1, queue_policy: fcfs, prefill_busy_threshold: 10, tenant_fairness: true}]
`)
	badTenants := writeFile(t, `
identity: {header: X-Tenant}
tenants: [{name: t, match: {exact: [t]}, allowed: [gold], default_family: gold}]
default_tenant: {weight: 0}
policy_classes: [{name: a, quantum: 1}]
`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, a := range tt.args {
				switch a {
				case "EMPTY":
					tt.args[i] = empty
				case "INVALID":
					tt.args[i] = invalid
				case "TENANTS":
					tt.args[i] = tenants
				case "BADTENANTS":
					tt.args[i] = badTenants
				}
			}
			code, stdout, stderr := runCLI(tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.code, stderr)
			}
			if stdout != tt.stdout {
				t.Errorf("stdout:\n%s\nwant:\n%s", stdout, tt.stdout)
			}
			for _, s := range tt.stderrIn {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr %q lacks %q", stderr, s)
				}
			}
		})
	}
}

func TestValidateModelsSample(t *testing.T) {
	code, stdout, stderr := runCLI("validate", filepath.Join(samples, "policy-models.yaml"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 8 {
		t.Fatalf("%d lines, want one per class (7) and the identity line:\n%s", len(lines), stdout)
	}
	for i, want := range map[int]string{
		0: `class "interactive-short": family interactive, bucket short (uncached >= 0), policy wspt, quantum 4096, threshold 2048 tokens, busy_worker_ratio 0.5, max queue wait 30s`,
		3: `class "background-long": family background, bucket long (uncached >= 2048), policy edf, quantum 512, threshold 0.5 × max_num_batched_tokens, limit raw_isl_tokens 65536/worker, limit cached_tokens 131072/worker`,
		4: `class "batch": explicit, policy fcfs, quantum 256, threshold 1024 tokens, limit requests 0/worker`,
		6: `model "meta-llama/Llama-3.1-8B-Instruct": class "gold": explicit, policy fcfs, quantum 4, threshold 1.5 × max_num_batched_tokens`,
	} {
		if lines[i] != want {
			t.Errorf("line %d:\n got %s\nwant %s", i, lines[i], want)
		}
	}
}

// TestConvertSamplesInSync keeps config/samples/objects equal to what
// convert makes of the YAML samples.
func TestConvertSamplesInSync(t *testing.T) {
	for _, name := range sampleNames {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCLI("convert", filepath.Join(samples, "policy-"+name+".yaml"), "--pool", "llm")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			committed, err := os.ReadFile(filepath.Join(samples, "objects", "policy-"+name+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if stdout != string(committed) {
				t.Errorf("config/samples/objects/policy-%s.yaml is stale; regenerate it with laneway convert:\n%s", name, stdout)
			}
		})
	}
}

func TestConvertErrors(t *testing.T) {
	sample := filepath.Join(samples, "policy-cache-buckets.yaml")
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"missing --pool", []string{"convert", sample}, 2, "", "--pool is required"},
		{"missing file argument", []string{"convert", "--pool", "llm"}, 2, "", "usage:"},
		{"unknown flag", []string{"convert", sample, "--pool", "llm", "--colour"}, 2, "", "unknown flag: --colour"},
		{"invalid policy", []string{"convert", writeFile(t, "policy_classes: [{name: a}]"), "--pool", "llm"}, 1, "", `class "a": quantum must be > 0 (got 0)`},
		{"no policy", []string{"convert", writeFile(t, ""), "--pool", "llm"}, 0,
			"# No policy classes: every request goes to the synthetic class \"default\"; no objects are needed.\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(tt.args...)
			if code != tt.code || stdout != tt.stdout || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("exit %d stdout %q stderr %q; want exit %d stdout %q stderr containing %q", code, stdout, stderr, tt.code, tt.stdout, tt.stderr)
			}
		})
	}
}

// TestConvertAppliesAndRoundTrips applies convert's output for each sample
// to a real API server, reads the objects back and checks they make the
// same model, resolving like the file.
func TestConvertAppliesAndRoundTrips(t *testing.T) {
	if _, err := testenv.AssetsDir(); errors.Is(err, testenv.ErrNoAssets) {
		t.Skip(err.Error())
	}
	cfg, stop, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range sampleNames {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(samples, "policy-"+name+".yaml")
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "convert-" + name}}
			if err := k8s.Create(ctx, ns); err != nil {
				t.Fatal(err)
			}
			code, stdout, stderr := runCLI("convert", file, "--pool", "llm", "--namespace", ns.Name)
			if code != 0 {
				t.Fatalf("convert: exit %d: %s", code, stderr)
			}
			docs := strings.Split(stdout, "\n---\n")
			for i, doc := range docs {
				var obj unstructured.Unstructured
				if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
					t.Fatalf("document %d: %v", i, err)
				}
				if err := k8s.Create(ctx, &obj); err != nil {
					t.Fatalf("apply document %d (%s %s): %v", i, obj.GetKind(), obj.GetName(), err)
				}
			}

			var profiles v1alpha1.PolicyProfileList
			var classes v1alpha1.PolicyClassList
			sel := client.MatchingLabels{policy.PoolLabel: "llm"}
			if err := k8s.List(ctx, &profiles, client.InNamespace(ns.Name), sel); err != nil {
				t.Fatal(err)
			}
			if err := k8s.List(ctx, &classes, client.InNamespace(ns.Name), sel); err != nil {
				t.Fatal(err)
			}
			if got := len(profiles.Items) + len(classes.Items); got != len(docs) {
				t.Fatalf("read back %d objects, applied %d", got, len(docs))
			}
			oc := policy.CheckObjects(profiles.Items, classes.Items)
			if len(oc.Problems) > 0 {
				t.Fatalf("objects read back are invalid: %v", oc.Problems)
			}
			want, err := policy.LoadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := oc.Config.Canonical(), want.Canonical(); !reflect.DeepEqual(got, want) {
				t.Fatalf("model from the API server differs from the file's:\n got %s\nwant %s", dump(got), dump(want))
			}
			fromFile, err := want.Compile()
			if err != nil {
				t.Fatal(err)
			}
			fromAPI, err := oc.Config.Compile()
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []string{"", "meta-llama/Llama-3.1-8B-Instruct"} {
				for _, h := range []string{"", "nope", "cached", "standard", "premium", "regular", "batch", "background", "gold", "silver"} {
					for _, u := range []uint64{0, 2047, 2048, 3071, 3072} {
						a, b := fromFile.Info[fromFile.Resolve(m, h, u)], fromAPI.Info[fromAPI.Resolve(m, h, u)]
						if a != b {
							t.Errorf("Resolve(%q, %q, %d): file %+v, API %+v", m, h, u, a, b)
						}
					}
				}
			}
		})
	}
}

func dump(c *policy.Config) string {
	out, err := yaml.Marshal(c)
	if err != nil {
		return fmt.Sprintf("%+v", c)
	}
	return string(out)
}

// TestSimulate runs `laneway simulate` in-process on a generated trace with
// a policy file and a baseline and checks it writes the table, the JSON,
// requests.jsonl per policy and the plots.
func TestSimulate(t *testing.T) {
	out := t.TempDir()
	code, stdout, stderr := runCLI("simulate",
		"--generate", "class=premium,arrival=once,count=40,prompt=512,output=2;class=regular,arrival=once,count=40,prompt=512,output=2",
		"--policy", filepath.Join(samples, "policy-premium-regular.yaml"), "--policy", "none",
		"--servers", "1", "--max-num-seqs", "4", "--enable-prefix-caching=false", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"policy", "TTFT p50/p90/p99 ms", "policy-premium-regular", "premium", "regular", "none"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	for _, f := range []string{"summary.json", "policy-premium-regular/requests.jsonl", "none/requests.jsonl",
		"completions.png", "completions.svg", "ttft-cdf.png", "ttft-cdf.svg", "queue-depth.png", "queue-depth.svg"} {
		st, err := os.Stat(filepath.Join(out, f))
		if err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
		if !strings.Contains(stderr, "wrote "+filepath.Join(out, f)) {
			t.Errorf("stderr does not name %s:\n%s", f, stderr)
		}
	}
}

// TestSimulateMooncake replays the committed Mooncake excerpt through the
// command with its trace flags: recognised by its fields, twice as fast,
// the first 6 requests, two classes by length, prefix caching on; the
// summary reports the engines' prefix hits.
func TestSimulateMooncake(t *testing.T) {
	out := t.TempDir()
	code, stdout, stderr := runCLI("simulate", "--trace", "../../internal/testbed/simulate/testdata/mooncake_excerpt.jsonl",
		"--trace-block-size", "512", "--time-scale", "0.5", "--limit", "6", "--assign-class", "length:short<3000,long",
		"--policy", "none", "--policy", "round-robin", "--servers", "2", "--no-plots", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"short", "long", "round-robin"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	b, err := os.ReadFile(filepath.Join(out, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sum struct {
		Trace struct {
			Source   string  `json:"source"`
			Requests int     `json:"requests"`
			SpanS    float64 `json:"span_s"`
		} `json:"trace"`
		Policies []struct {
			Policy        string  `json:"policy"`
			PrefixHitRate float64 `json:"prefix_hit_rate"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	// Arrivals 0, 9, 12, 21, 48, 48 s at half the time: the last at 24 s.
	if sum.Trace.Requests != 6 || sum.Trace.SpanS != 24 || !strings.HasSuffix(sum.Trace.Source, "(time ×0.5, 6 of 8 requests)") {
		t.Fatalf("trace %+v", sum.Trace)
	}
	for _, p := range sum.Policies {
		if p.PrefixHitRate <= 0 {
			t.Errorf("%s: prefix hit rate %v, want > 0 (every prompt starts with id 0)", p.Policy, p.PrefixHitRate)
		}
	}
}

func TestSimulateUsage(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"no trace", []string{"simulate"}, 2, "", "give one of --trace FILE and --generate SPEC"},
		{"both traces", []string{"simulate", "--trace", "x.jsonl", "--generate", "prompt=1,arrival=once,count=1"}, 2, "", "give one of"},
		{"unknown flag", []string{"simulate", "--colour"}, 2, "", "unknown flag: --colour"},
		{"stray argument", []string{"simulate", "--generate", "x", "extra"}, 2, "", `unexpected argument "extra"`},
		{"help", []string{"simulate", "--help"}, 0, "SPEC is one or more streams", ""},
		{"bad spec", []string{"simulate", "--generate", "prompt=1", "--out", t.TempDir()}, 1, "", "arrival=poisson needs rate=R"},
		{"bad trace format", []string{"simulate", "--trace", "x.jsonl", "--trace-format", "csv", "--out", t.TempDir()}, 1, "", `--trace-format "csv"`},
		{"bad time scale", []string{"simulate", "--generate", "prompt=1,arrival=once,count=1", "--time-scale", "0"}, 2, "", `invalid argument "0" for "--time-scale" flag: want a positive number`},
		{"missing policy", []string{"simulate", "--generate", "prompt=1,arrival=once,count=1", "--policy", "nope.yaml", "--out", t.TempDir()}, 1, "", "nope.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(tt.args...)
			if code != tt.code || !holds(stdout, tt.stdout) || !holds(stderr, tt.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %d, %q, %q (\"\": nothing)", code, stdout, stderr, tt.code, tt.stdout, tt.stderr)
			}
		})
	}
}

// holds reports whether out contains want, or is empty when want is "".
func holds(out, want string) bool {
	if want == "" {
		return out == ""
	}
	return strings.Contains(out, want)
}
