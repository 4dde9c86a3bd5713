package policy

import (
	"fmt"
	"io"
	"strings"

	"github.com/laneway-dev/laneway/pkg/drr"
)

// Describe writes what the policy does, as `laneway validate` prints it:
// one line per compiled class, one per tenant binding (saying so when an
// earlier binding matches every identity it selects), one for the default
// tenant, and last one saying whom the picker trusts. Defaults show as
// the picker applies them. It compiles c, so an invalid c is an error.
func (c *Config) Describe(w io.Writer) error {
	comp, err := c.Compile()
	if err != nil {
		return err
	}
	var b strings.Builder
	for i := range comp.Classes {
		b.WriteString(c.describeClass(comp, i))
		b.WriteByte('\n')
	}
	identity := c.Identity != nil
	for i := range c.Tenants {
		t := &c.Tenants[i]
		fmt.Fprintf(&b, "tenant %q: %s", t.Name, describeRights(&t.Match, &t.Rights, identity))
		if by := shadowedBy(c.Tenants[:i], t); by != "" {
			fmt.Fprintf(&b, "; never matches: tenant %q comes first for every identity it selects", by)
		}
		b.WriteByte('\n')
	}
	if r := c.DefaultTenant; r != nil {
		fmt.Fprintf(&b, "default tenant: %s\n", describeRights(&TenantMatch{}, r, identity))
	}
	b.WriteString(comp.Identity().String())
	b.WriteByte('\n')
	_, err = io.WriteString(w, b.String())
	return err
}

// describeClass is one line describing compiled class i.
func (c *Config) describeClass(comp *Compiled, i int) string {
	in, cc, bt := comp.Info[i], comp.Classes[i], comp.Busy[i]
	var b strings.Builder
	if in.Model != "" {
		fmt.Fprintf(&b, "model %q: ", in.Model)
	}
	fmt.Fprintf(&b, "class %q: ", in.Name)
	switch {
	case in.Synthetic:
		b.WriteString("synthetic (no policy classes), ")
	case in.Family == "":
		b.WriteString("explicit, ")
	default:
		fmt.Fprintf(&b, "family %s, bucket %s (uncached >= %d), ", in.Family, in.Bucket, c.bucketMin(in))
	}
	fmt.Fprintf(&b, "policy %s, quantum %d, %s", cc.Policy, cc.Quantum, bt.String())
	for _, l := range []struct {
		name string
		v    uint64
	}{
		{"requests", cc.RequestLimitPerWorker},
		{"raw_isl_tokens", cc.RawISLLimitPerWorker},
		{"cached_tokens", cc.CachedLimitPerWorker},
	} {
		if l.v != drr.NoLimit {
			fmt.Fprintf(&b, ", limit %s %d/worker", l.name, l.v)
		}
	}
	if cc.WaitBudget > 0 {
		fmt.Fprintf(&b, ", max queue wait %s", cc.WaitBudget)
	}
	if cc.TenantFairness {
		fmt.Fprintf(&b, ", tenant-fair (at most %d tenants)", cc.MaxTenants)
	}
	if d := comp.Disaggregate[i]; d.Set {
		fmt.Fprintf(&b, ", disaggregated above %d uncached tokens", d.AboveUncached)
	}
	return b.String()
}

// bucketMin is the min_tokens of the cache bucket of class in, in the
// profile the class comes from.
func (c *Config) bucketMin(in ClassInfo) int64 {
	p := &c.Root
	for i := range c.Models {
		if c.Models[i].Model == in.Model && in.Model != "" {
			p = &c.Models[i].Profile
		}
	}
	for _, b := range p.Buckets {
		if b.Name == in.Bucket {
			return b.MinTokens
		}
	}
	return 0
}

// shadowedBy returns the name of an earlier binding that matches every
// identity b selects (so b never wins: the first match does), or "".
func shadowedBy(earlier []TenantBinding, b *TenantBinding) string {
	for i := range earlier {
		e := &earlier[i]
		covers := func(id string, prefix bool) bool {
			if !prefix && e.Match.Matches(id) {
				return true
			}
			for _, p := range e.Match.Prefix {
				if strings.HasPrefix(id, p) {
					return true
				}
			}
			return false
		}
		all := true
		for _, id := range b.Match.Exact {
			all = all && covers(id, false)
		}
		for _, p := range b.Match.Prefix {
			all = all && covers(p, true)
		}
		if all {
			return e.Name
		}
	}
	return ""
}

// describeRights says what a binding matches (nothing for the default
// tenant) and grants, with the defaults filled in as the picker applies
// them: identity says whether an identity source is configured, which
// makes an unset cap 0 instead of none.
func describeRights(m *TenantMatch, r *Rights, identity bool) string {
	var parts []string
	var ids []string
	ids = append(ids, m.Exact...)
	for _, p := range m.Prefix {
		ids = append(ids, p+"*")
	}
	if len(ids) > 0 {
		parts = append(parts, "identities "+strings.Join(ids, ", "))
	}
	switch {
	case len(r.Allowed) > 0:
		parts = append(parts, fmt.Sprintf("allowed %s (default %s)", strings.Join(r.Allowed, ", "), r.Default()))
	case r.DefaultFamily != "":
		parts = append(parts, fmt.Sprintf("any class (default %s)", r.DefaultFamily))
	default:
		parts = append(parts, "any class")
	}
	weight := int64(1)
	if r.Weight != nil {
		weight = *r.Weight
	}
	parts = append(parts, fmt.Sprintf("weight %d", weight))
	capText := func(v *int64) string {
		switch {
		case v != nil:
			return fmt.Sprint(*v)
		case identity:
			return "0"
		}
		return "none"
	}
	parts = append(parts, fmt.Sprintf("caps priority %s, strict %s", capText(r.MaxPriority), capText(r.MaxStrictPriority)))
	var limits []string
	if v := r.RequestQueueLimit; v != nil {
		limits = append(limits, fmt.Sprintf("%d requests", *v))
	}
	if v := r.RawISLTokenQueueLimit; v != nil {
		limits = append(limits, fmt.Sprintf("%d raw_isl_tokens", *v))
	}
	if len(limits) > 0 {
		parts = append(parts, "limits "+strings.Join(limits, ", ")+" per class")
	}
	return strings.Join(parts, "; ")
}
