package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Bounds on a policy file (real ones are a few kilobytes). They keep a
// file that reuses anchors many times from costing unbounded work.
const (
	maxYAMLBytes     = 4 << 20
	maxClassesInFile = 16 * 1024
	// maxAliasNodes is how many nodes aliases may add to a file's own
	// (every reuse of an anchor walks its nodes again): a real policy
	// that shares its classes between model profiles adds a few thousand,
	// while a file of a few kilobytes of aliases to aliases stands for
	// billions.
	maxAliasNodes = 100_000
	// maxParseProblems bounds the problems the parser collects: a file
	// with a million bad entries says so in a page, not 100 MB.
	maxParseProblems = 100
)

// List bounds, as the CRDs' schemas give the same fields
// (api/v1alpha1): a file cannot hold what the API server would refuse.
const (
	maxAllowed      = 1024
	maxExact        = 10_000
	maxPrefix       = 1000
	maxMetadataPath = 16
	maxBuckets      = 32
)

// LoadFile reads and validates the policy YAML file at path (LoadYAML).
func LoadFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy file: %w", err)
	}
	cfg, err := LoadYAML(data)
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	return cfg, nil
}

// LoadYAML parses a policy in the reference router's YAML format and
// validates it. The error is a Problems (every problem, one per line): the
// syntax problems when the file cannot be read, else every rule the policy
// breaks. An empty document is the empty Config (the synthetic class only).
func LoadYAML(data []byte) (*Config, error) {
	cfg, err := ParseYAML(data)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// ParseYAML reads the reference YAML strictly without validating the rules:
// an unknown key at any level (models profiles included), a repeated key, a
// value of the wrong type or a second document is a problem. Absent
// queue_policy becomes DefaultQueuePolicy.
func ParseYAML(data []byte) (*Config, error) {
	if len(data) > maxYAMLBytes {
		return nil, Problems{{Rule: RuleSyntax, Message: fmt.Sprintf("policy YAML is %d bytes, at most %d allowed", len(data), maxYAMLBytes)}}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &Config{}, nil
		}
		return nil, Problems{{Rule: RuleSyntax, Message: fmt.Sprintf("policy YAML: %v", err)}}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		line := extra.Line
		if err != nil {
			return nil, Problems{{Rule: RuleSyntax, Message: fmt.Sprintf("policy YAML: %v", err)}}
		}
		return nil, Problems{{Rule: RuleSyntax, Message: fmt.Sprintf("line %d: policy YAML has more than one document", line)}}
	}
	p := &parser{budget: 2*countNodes(&doc) + maxAliasNodes}
	cfg := &Config{}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return cfg, nil
		}
		root = root.Content[0]
	}
	if isNull(root) {
		return cfg, nil
	}
	p.profile(root, "", &cfg.Root, &cfg.Models, cfg)
	if p.dropped > 0 {
		p.problems = append(p.problems, Problem{Rule: RuleSyntax, Message: fmt.Sprintf("and %d more problems", p.dropped)})
	}
	if len(p.problems) > 0 {
		return nil, p.problems
	}
	return cfg, nil
}

// parser walks the YAML node tree against the schema, collecting every
// problem with its line and path instead of stopping at the first.
type parser struct {
	problems Problems
	// classes counts class mappings walked, across aliases, to bound work.
	classes int
	// budget is how many mapping entries and list elements the walk may
	// visit, aliases expanded: twice the file's own nodes and
	// maxAliasNodes. Past it the walk stops (expanded) with one problem.
	budget   int
	expanded bool
	// dropped counts problems past maxParseProblems.
	dropped int
}

// countNodes counts the nodes of the tree under n without following
// aliases: the file's own size in nodes.
func countNodes(n *yaml.Node) int {
	c := 1
	for _, e := range n.Content {
		c += countNodes(e)
	}
	return c
}

// visit spends one unit of the walk's budget; false once it is spent.
func (p *parser) visit(n *yaml.Node, path string) bool {
	if p.expanded {
		return false
	}
	if p.budget--; p.budget < 0 {
		p.expanded = true
		p.errorf(n, path, "aliases expand the file past %d nodes; write the repeated parts out, or reuse less", maxAliasNodes)
		return false
	}
	return true
}

func (p *parser) errorf(n *yaml.Node, path, format string, args ...any) {
	if len(p.problems) >= maxParseProblems && !p.expanded {
		p.dropped++
		return
	}
	msg := fmt.Sprintf(format, args...)
	if path != "" {
		msg = path + ": " + msg
	}
	if n != nil && n.Line > 0 {
		msg = fmt.Sprintf("line %d: %s", n.Line, msg)
	}
	p.problems = append(p.problems, Problem{Rule: RuleSyntax, Message: msg})
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	n = resolveAlias(n)
	return n == nil || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

// mapping calls fn for each key of the mapping n, rejecting keys not in
// allowed and repeated keys. The keys are listed in the error so the
// reader sees the spelling wanted.
func (p *parser) mapping(n *yaml.Node, path string, allowed []string, fn func(key string, v *yaml.Node)) {
	n = resolveAlias(n)
	if n == nil || n.Kind != yaml.MappingNode {
		if !isNull(n) {
			p.errorf(n, path, "want a mapping, got %s", kindName(n))
		}
		return
	}
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		if !p.visit(n.Content[i], path) {
			return
		}
		k, v := resolveAlias(n.Content[i]), n.Content[i+1]
		if k == nil || k.Kind != yaml.ScalarNode {
			p.errorf(n.Content[i], path, "keys must be strings")
			continue
		}
		if k.Tag == "!!merge" {
			p.errorf(k, path, "merge keys (<<) are not supported")
			continue
		}
		key := k.Value
		if !slices.Contains(allowed, key) {
			p.errorf(k, path, "unknown key %q (allowed: %s)", key, strings.Join(allowed, ", "))
			continue
		}
		if seen[key] {
			p.errorf(k, path, "key %q repeats", key)
			continue
		}
		seen[key] = true
		if isNull(v) {
			continue // an explicit null is the same as an absent key
		}
		fn(key, v)
	}
}

var (
	profileKeys  = []string{"default_policy_family", "uncached_isl_buckets", "default_policy_class", "policy_classes"}
	rootKeys     = append(slices.Clone(profileKeys), "models", "identity", "tenants", "default_tenant")
	identityKeys = []string{"header", "metadata", "anonymous"}
	metadataKeys = []string{"namespace", "path"}
	rightsKeys   = []string{"allowed", "default_family", "weight", "max_priority",
		"max_strict_priority", "request_queue_limit", "raw_isl_token_queue_limit"}
	bindingKeys = append([]string{"name", "match"}, rightsKeys...)
	matchKeys   = []string{"exact", "prefix"}
	bucketKeys  = []string{"min_tokens", "bucket"}
	classKeys   = []string{
		"name", "policy_family", "cache_bucket", "queue_policy", "quantum",
		"prefill_busy_threshold", "prefill_busy_threshold_frac", "busy_worker_ratio",
		"request_queue_limit_per_worker", "raw_isl_token_queue_limit_per_worker",
		"cached_token_queue_limit_per_worker", "max_queue_wait", "tenant_fairness", "max_tenants",
		"disaggregate_above_uncached_tokens",
	}
)

// profile reads a profile mapping. models and cfg are non-nil only at the
// root: a model profile cannot nest models or tenant rules.
func (p *parser) profile(n *yaml.Node, path string, out *Profile, models *[]ModelProfile, cfg *Config) {
	keys := profileKeys
	if models != nil {
		keys = rootKeys
	}
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	p.mapping(n, path, keys, func(key string, v *yaml.Node) {
		switch key {
		case "default_policy_family":
			out.DefaultFamily = p.str(v, join(key))
		case "default_policy_class":
			out.DefaultClass = p.str(v, join(key))
		case "uncached_isl_buckets":
			p.boundedSequence(v, join(key), maxBuckets, func(i int, e *yaml.Node) {
				var b Bucket
				ep := fmt.Sprintf("%s[%d]", join(key), i)
				p.mapping(e, ep, bucketKeys, func(k string, v *yaml.Node) {
					switch k {
					case "min_tokens":
						b.MinTokens = p.int(v, ep+"."+k)
					case "bucket":
						b.Name = p.str(v, ep+"."+k)
					}
				})
				out.Buckets = append(out.Buckets, b)
			})
		case "policy_classes":
			if n := resolveAlias(v); n.Kind == yaml.SequenceNode && len(n.Content) == 0 {
				out.EmptyClasses = true
			}
			p.sequence(v, join(key), func(i int, e *yaml.Node) {
				p.classes++
				if p.classes > maxClassesInFile {
					if p.classes == maxClassesInFile+1 {
						p.errorf(e, join(key), "too many classes in the file")
					}
					return
				}
				out.Classes = append(out.Classes, p.class(e, fmt.Sprintf("%s[%d]", join(key), i)))
			})
		case "identity":
			cfg.Identity = p.identity(v, key)
		case "tenants":
			p.sequence(v, key, func(i int, e *yaml.Node) {
				if len(cfg.Tenants) >= MaxTenantBindings {
					if len(cfg.Tenants) == MaxTenantBindings {
						p.errorf(e, key, "more than %d tenant bindings", MaxTenantBindings)
						cfg.Tenants = append(cfg.Tenants, TenantBinding{})
					}
					return
				}
				cfg.Tenants = append(cfg.Tenants, p.binding(e, fmt.Sprintf("%s[%d]", key, i)))
			})
		case "default_tenant":
			r := p.rights(v, key)
			cfg.DefaultTenant = &r
		case "models":
			v = resolveAlias(v)
			if v.Kind != yaml.MappingNode {
				p.errorf(v, key, "want a mapping of model name to profile, got %s", kindName(v))
				return
			}
			seen := map[string]bool{}
			for i := 0; i+1 < len(v.Content); i += 2 {
				k := resolveAlias(v.Content[i])
				if k == nil || k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
					p.errorf(v.Content[i], key, "model names must be strings")
					continue
				}
				mp := fmt.Sprintf("models[%q]", k.Value)
				if seen[k.Value] {
					p.errorf(k, mp, "model repeats")
					continue
				}
				seen[k.Value] = true
				if len(*models) >= MaxModels {
					p.errorf(k, mp, "more than %d model profiles", MaxModels)
					return
				}
				m := ModelProfile{Model: k.Value}
				p.profile(v.Content[i+1], mp, &m.Profile, nil, nil)
				*models = append(*models, m)
			}
		}
	})
}

func (p *parser) class(n *yaml.Node, path string) Class {
	c := Class{QueuePolicy: DefaultQueuePolicy}
	p.mapping(n, path, classKeys, func(key string, v *yaml.Node) {
		kp := path + "." + key
		switch key {
		case "name":
			c.Name = p.str(v, kp)
		case "policy_family":
			c.Family = p.str(v, kp)
		case "cache_bucket":
			c.Bucket = p.str(v, kp)
		case "queue_policy":
			c.QueuePolicy = p.str(v, kp)
		case "quantum":
			c.Quantum = p.int(v, kp)
		case "prefill_busy_threshold":
			if v.Kind == yaml.ScalarNode && v.Tag == "!!str" {
				switch v.Value {
				case BusyAuto, BusyNone:
					c.BusyMode = v.Value
				default:
					p.errorf(v, kp, "want an integer, auto or none, got %q", v.Value)
				}
				return
			}
			c.PrefillBusyThreshold = ptr(p.int(v, kp))
		case "prefill_busy_threshold_frac":
			c.PrefillBusyThresholdFrac = ptr(p.float(v, kp))
		case "busy_worker_ratio":
			c.BusyWorkerRatio = ptr(p.float(v, kp))
		case "request_queue_limit_per_worker":
			c.RequestQueueLimitPerWorker = ptr(p.int(v, kp))
		case "raw_isl_token_queue_limit_per_worker":
			c.RawISLTokenQueueLimitPerWorker = ptr(p.int(v, kp))
		case "cached_token_queue_limit_per_worker":
			c.CachedTokenQueueLimitPerWorker = ptr(p.int(v, kp))
		case "tenant_fairness":
			c.TenantFairness = p.bool(v, kp)
		case "max_tenants":
			c.MaxTenants = ptr(p.int(v, kp))
		case "disaggregate_above_uncached_tokens":
			c.DisaggregateAboveUncachedTokens = ptr(p.int(v, kp))
		case "max_queue_wait":
			s := p.str(v, kp)
			if s == "" {
				return
			}
			d, err := time.ParseDuration(s)
			if err != nil {
				p.errorf(v, kp, "want a duration such as 30s or 1m30s, got %q", s)
				return
			}
			c.MaxQueueWait = d
		}
	})
	return c
}

func ptr[T any](v T) *T { return &v }

func (p *parser) identity(n *yaml.Node, path string) *Identity {
	id := &Identity{}
	p.mapping(n, path, identityKeys, func(key string, v *yaml.Node) {
		kp := path + "." + key
		switch key {
		case "header":
			id.Header = p.str(v, kp)
		case "anonymous":
			id.Anonymous = p.str(v, kp)
		case "metadata":
			p.mapping(v, kp, metadataKeys, func(k string, v *yaml.Node) {
				switch k {
				case "namespace":
					id.MetadataNamespace = p.str(v, kp+"."+k)
				case "path":
					id.MetadataPath = p.strs(v, kp+"."+k, maxMetadataPath)
				}
			})
		}
	})
	return id
}

// binding reads a tenant binding: a name, a match and rights.
func (p *parser) binding(n *yaml.Node, path string) TenantBinding {
	var b TenantBinding
	p.mapping(n, path, bindingKeys, func(key string, v *yaml.Node) {
		kp := path + "." + key
		switch key {
		case "name":
			b.Name = p.str(v, kp)
		case "match":
			p.mapping(v, kp, matchKeys, func(k string, v *yaml.Node) {
				switch k {
				case "exact":
					b.Match.Exact = p.strs(v, kp+"."+k, maxExact)
				case "prefix":
					b.Match.Prefix = p.strs(v, kp+"."+k, maxPrefix)
				}
			})
		default:
			p.right(&b.Rights, key, v, kp)
		}
	})
	return b
}

// rights reads default_tenant: rights alone, so a name or a match there
// is an unknown key.
func (p *parser) rights(n *yaml.Node, path string) Rights {
	var r Rights
	p.mapping(n, path, rightsKeys, func(key string, v *yaml.Node) {
		p.right(&r, key, v, path+"."+key)
	})
	return r
}

// right reads the value v of one of rightsKeys into r.
func (p *parser) right(r *Rights, key string, v *yaml.Node, kp string) {
	switch key {
	case "allowed":
		r.Allowed = p.strs(v, kp, maxAllowed)
	case "default_family":
		r.DefaultFamily = p.str(v, kp)
	case "weight":
		r.Weight = ptr(p.int(v, kp))
	case "max_priority":
		r.MaxPriority = ptr(p.int(v, kp))
	case "max_strict_priority":
		r.MaxStrictPriority = ptr(p.int(v, kp))
	case "request_queue_limit":
		r.RequestQueueLimit = ptr(p.int(v, kp))
	case "raw_isl_token_queue_limit":
		r.RawISLTokenQueueLimit = ptr(p.int(v, kp))
	}
}

// strs reads a list of at most max strings.
func (p *parser) strs(n *yaml.Node, path string, max int) []string {
	var out []string
	p.boundedSequence(n, path, max, func(i int, e *yaml.Node) {
		out = append(out, p.str(e, fmt.Sprintf("%s[%d]", path, i)))
	})
	return out
}

func (p *parser) bool(n *yaml.Node, path string) bool {
	if n = p.scalar(n, path, "true or false"); n == nil {
		return false
	}
	var v bool
	if n.Tag != "!!bool" || n.Decode(&v) != nil {
		p.errorf(n, path, "want true or false, got %q", n.Value)
		return false
	}
	return v
}

func (p *parser) sequence(n *yaml.Node, path string, fn func(i int, e *yaml.Node)) {
	p.boundedSequence(n, path, 0, fn)
}

// boundedSequence is sequence for a list of at most max elements (0: no
// bound of its own).
func (p *parser) boundedSequence(n *yaml.Node, path string, max int, fn func(i int, e *yaml.Node)) {
	n = resolveAlias(n)
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, path, "want a list, got %s", kindName(n))
		return
	}
	if max > 0 && len(n.Content) > max {
		p.errorf(n, path, "more than %d entries (%d)", max, len(n.Content))
		return
	}
	for i, e := range n.Content {
		if !p.visit(e, path) {
			return
		}
		fn(i, e)
	}
}

func (p *parser) scalar(n *yaml.Node, path, want string) *yaml.Node {
	n = resolveAlias(n)
	if n == nil || n.Kind != yaml.ScalarNode {
		p.errorf(n, path, "want %s, got %s", want, kindName(n))
		return nil
	}
	return n
}

func (p *parser) str(n *yaml.Node, path string) string {
	if n = p.scalar(n, path, "a string"); n == nil {
		return ""
	}
	return n.Value
}

func (p *parser) int(n *yaml.Node, path string) int64 {
	if n = p.scalar(n, path, "an integer"); n == nil {
		return 0
	}
	var v int64
	if n.Tag != "!!int" || n.Decode(&v) != nil {
		p.errorf(n, path, "want an integer, got %q", n.Value)
		return 0
	}
	return v
}

func (p *parser) float(n *yaml.Node, path string) float64 {
	if n = p.scalar(n, path, "a number"); n == nil {
		return 0
	}
	var v float64
	if (n.Tag != "!!int" && n.Tag != "!!float") || n.Decode(&v) != nil {
		p.errorf(n, path, "want a number, got %q", n.Value)
		return 0
	}
	return v
}
