package policy

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/laneway-dev/laneway/pkg/drr"
)

// Tenants (SPEC §14): who a request is for, and what that caller may do.
//
// Without an Identity, a request's tenant is what its x-laneway-tenant
// header says and its hints are trusted as sent, as the reference router
// trusts them behind its own frontend. With one, the tenant comes from a
// source a client cannot forge (a metadata field the gateway's JWT filter
// writes, or a header the gateway sets after authentication), and the
// bindings decide which classes it may use and cap its hints.

// TenantHeader is the header that names a request's tenant when no
// identity is configured.
const TenantHeader = "x-laneway-tenant"

// DefaultAnonymousTenant is the tenant of a request that brings no
// identity (or, without identity, no tenant header).
const DefaultAnonymousTenant = "anonymous"

// DefaultMaxTenants bounds the active tenants of a tenant-fair class that
// sets no max_tenants.
const DefaultMaxTenants = 10_000

// MaxTenantBindings bounds the bindings of one policy.
const MaxTenantBindings = 10_000

// Identity says where a request's tenant identity comes from. Sources are
// tried in order: the metadata field, then the header.
type Identity struct {
	// Header is a request header the gateway sets after authentication
	// (and strips from what clients send).
	Header string
	// MetadataNamespace and MetadataPath name a field of the ext_proc
	// metadata_context the gateway forwards (e.g. namespace
	// envoy.filters.http.jwt_authn, path [provider, sub]).
	MetadataNamespace string
	MetadataPath      []string
	// Anonymous is the tenant of a request without an identity;
	// DefaultAnonymousTenant when empty.
	Anonymous string
}

// AnonymousTenant returns the tenant of a request without an identity.
func (id *Identity) AnonymousTenant() string {
	if id == nil || id.Anonymous == "" {
		return DefaultAnonymousTenant
	}
	return id.Anonymous
}

// String describes the identity source in one line (for logs and laneway
// validate).
func (id *Identity) String() string {
	if id == nil {
		return "no identity configured: the x-laneway-tenant header names the tenant and client hints are trusted as sent"
	}
	return fmt.Sprintf("identity from %s; requests without one are tenant %q", id.Sources(), id.AnonymousTenant())
}

// Sources names where the identity is read, in the order tried: e.g.
// "metadata envoy.filters.http.jwt_authn/idp.sub, then header x-tenant-id".
func (id *Identity) Sources() string {
	var src []string
	if id.MetadataNamespace != "" {
		src = append(src, fmt.Sprintf("metadata %s/%s", id.MetadataNamespace, strings.Join(id.MetadataPath, ".")))
	}
	if id.Header != "" {
		src = append(src, "header "+id.Header)
	}
	return strings.Join(src, ", then ")
}

// TenantMatch selects identities: any exact value or any prefix.
type TenantMatch struct {
	Exact  []string
	Prefix []string
}

// Matches reports whether identity id is selected.
func (m *TenantMatch) Matches(id string) bool {
	if slices.Contains(m.Exact, id) {
		return true
	}
	for _, p := range m.Prefix {
		if strings.HasPrefix(id, p) {
			return true
		}
	}
	return false
}

// Rights is what a tenant may do: the classes it may ask for, its DRR
// weight, its hint caps and its queue limits. A TenantBinding grants them
// to the identities it matches, and Config.DefaultTenant, which has no
// name and no match, to every other identity. (TenantRights is their
// compiled form, resolved for one request.)
type Rights struct {
	// Allowed lists the families and explicit class names the tenant may
	// ask for; empty means any. A class header outside it is ignored.
	Allowed []string
	// DefaultFamily is used when the request asks for no class, or for one
	// not allowed: a family, or an explicit class name. With one Allowed
	// entry it may be left empty: that entry is the default (Default).
	DefaultFamily string
	// Weight is the tenant's DRR weight inside tenant-fair classes (1 when
	// nil).
	Weight *int64
	// MaxPriority and MaxStrictPriority cap the hints (clamped, not
	// rejected); nil is 0 when an identity is configured, no cap without.
	MaxPriority       *int64
	MaxStrictPriority *int64
	// RequestQueueLimit and RawISLTokenQueueLimit bound the tenant's queued
	// requests and raw prompt tokens in each class; nil is none.
	RequestQueueLimit     *int64
	RawISLTokenQueueLimit *int64
}

// TenantBinding names the tenant of the identities it matches and grants
// it its Rights.
type TenantBinding struct {
	// Name is the tenant of every identity the binding matches (they share
	// one DRR share and one set of queue limits).
	Name  string
	Match TenantMatch
	Rights
}

// HeaderNamePattern is what identity.header must match: a lower-case
// HTTP header name (RFC 9110 token characters), the pattern the
// PolicyProfile CRD validates the same field with.
const HeaderNamePattern = `^[a-z0-9!#$%&'*+.^_|~-]+$`

var headerName = regexp.MustCompile(HeaderNamePattern)

// validateTenants appends the problems of the identity and tenant settings.
func validateTenants(ps *Problems, c *Config) {
	add := func(r Rule, format string, args ...any) {
		*ps = append(*ps, Problem{Rule: r, Message: fmt.Sprintf(format, args...)})
	}
	if id := c.Identity; id != nil {
		if id.Header == "" && id.MetadataNamespace == "" {
			add(RuleIdentity, "identity: set header, metadata, or both")
		}
		if id.Header != "" && !headerName.MatchString(id.Header) {
			add(RuleIdentity, "identity.header %q must be a lower-case header name", id.Header)
		}
		if (id.MetadataNamespace == "") != (len(id.MetadataPath) == 0) {
			add(RuleIdentity, "identity.metadata: namespace and path go together (namespace %q, path %v)", id.MetadataNamespace, id.MetadataPath)
		}
		if slices.Contains(id.MetadataPath, "") {
			add(RuleIdentity, "identity.metadata.path %v has an empty key", id.MetadataPath)
		}
	}
	if len(c.Tenants) > MaxTenantBindings {
		add(RuleTooLarge, "tenants: %d bindings, at most %d allowed", len(c.Tenants), MaxTenantBindings)
		return
	}
	names := map[string]int{}
	for i := range c.Tenants {
		b := &c.Tenants[i]
		where := fmt.Sprintf("tenants[%d]", i)
		if b.Name != "" {
			where = fmt.Sprintf("tenant %q", b.Name)
		}
		switch j, dup := names[b.Name]; {
		case b.Name == "":
			add(RuleTenant, "%s: name is required", where)
		case dup:
			add(RuleTenant, "%s: name is used by more than one binding (tenants[%d] and [%d])", where, j, i)
		default:
			names[b.Name] = i
		}
		if len(b.Match.Exact) == 0 && len(b.Match.Prefix) == 0 {
			add(RuleTenant, "%s: match needs at least one exact value or prefix", where)
		}
		if slices.Contains(b.Match.Prefix, "") {
			add(RuleTenant, "%s: match.prefix \"\" would match every identity; use default_tenant", where)
		}
		validateRights(add, where, &b.Rights, c)
	}
	if r := c.DefaultTenant; r != nil {
		validateRights(add, "default_tenant", r, c)
	}
}

// Default returns where requests that ask for no class, or for one not
// allowed, go: DefaultFamily, else the one Allowed entry, else "".
func (r *Rights) Default() string {
	if r.DefaultFamily == "" && len(r.Allowed) == 1 {
		return r.Allowed[0]
	}
	return r.DefaultFamily
}

// validateRights checks the rights of one binding (or of the default
// tenant) against the classes of the root and of every model profile:
// bindings apply to all of them.
func validateRights(add func(Rule, string, ...any), where string, b *Rights, c *Config) {
	inProfile := func(p *Profile, name string) bool {
		for i := range p.Classes {
			cl := &p.Classes[i]
			if (cl.Explicit() && cl.Name == name) || cl.Family == name {
				return true
			}
		}
		return false
	}
	known := func(name string) bool {
		if inProfile(&c.Root, name) {
			return true
		}
		for i := range c.Models {
			if inProfile(&c.Models[i].Profile, name) {
				return true
			}
		}
		return false
	}
	unknown := 0
	for _, a := range b.Allowed {
		if !known(a) {
			add(RuleTenant, "%s: allowed %q names no policy family or explicit class", where, a)
			unknown++
		}
	}
	if unknown == 0 {
		validateReach(add, where, b.Allowed, c)
	}
	switch def := b.Default(); {
	case len(b.Allowed) > 0 && def == "":
		add(RuleTenant, "%s: allowed has %d entries, so default_family is required (where requests that ask for another class go)", where, len(b.Allowed))
	case def != "" && !known(def):
		add(RuleTenant, "%s: default_family %q names no policy family or explicit class", where, def)
	case b.DefaultFamily != "" && len(b.Allowed) > 0 && !slices.Contains(b.Allowed, b.DefaultFamily):
		add(RuleTenant, "%s: default_family %q is not in allowed %v", where, b.DefaultFamily, b.Allowed)
	}
	if b.Weight != nil && (*b.Weight < 1 || *b.Weight > 1_000_000) {
		add(RuleTenant, "%s: weight must be between 1 and 1000000 (got %d)", where, *b.Weight)
	}
	for _, l := range []struct {
		key string
		v   *int64
		min int64
	}{
		{"max_priority", b.MaxPriority, 0},
		{"max_strict_priority", b.MaxStrictPriority, 0},
		{"request_queue_limit", b.RequestQueueLimit, 1},
		{"raw_isl_token_queue_limit", b.RawISLTokenQueueLimit, 1},
	} {
		if l.v != nil && *l.v < l.min {
			add(RuleNegative, "%s: %s must be >= %d (got %d)", where, l.key, l.min, *l.v)
		}
	}
	if v := b.MaxPriority; v != nil && *v > 1<<31-1 {
		add(RuleTenant, "%s: max_priority %d does not fit int32", where, *v)
	}
	if v := b.MaxStrictPriority; v != nil && *v > 1<<32-1 {
		add(RuleTenant, "%s: max_strict_priority %d does not fit uint32", where, *v)
	}
}

// compiledTenants is the tenant side of a Compiled policy.
type compiledTenants struct {
	identity *Identity
	// bindings in file order; exact maps an identity to the first binding
	// that lists it exactly; prefixed lists the bindings with prefixes.
	bindings []CompiledBinding
	exact    map[string]int
	prefixed []int
	prefixes [][]string // by binding
	def      CompiledBinding
	// track: some class is tenant-fair or some binding sets a limit, so
	// requests carry a tenant to the queue; otherwise they carry none and
	// the queue keeps no per-tenant state.
	track bool
}

// CompiledBinding is a tenant binding ready for the request path.
type CompiledBinding struct {
	// Name is the binding's name; "" for the default binding, whose
	// tenants are their identities.
	Name          string
	allowed       map[string]bool // nil: any class
	allowedOrder  []string        // allowed's names, in the binding's order
	defaultFamily string
	weight        uint64
	maxPriority   int32
	maxStrict     uint32
	requestLimit  uint64 // 0: none
	rawLimit      uint64 // 0: none
}

// compileBinding compiles the rights b of the binding called name ("" for
// the default tenant).
func compileBinding(name string, b *Rights, identity bool) CompiledBinding {
	out := CompiledBinding{Name: name, defaultFamily: b.Default(), weight: 1}
	if len(b.Allowed) > 0 {
		out.allowed = make(map[string]bool, len(b.Allowed))
		for _, a := range b.Allowed {
			out.allowed[a] = true
		}
		out.allowedOrder = slices.Clone(b.Allowed)
	}
	if b.Weight != nil {
		out.weight = uint64(*b.Weight)
	}
	// With an identity the caps default to 0 (a client's hints count for
	// nothing unless granted); without one there is no cap unless set.
	out.maxPriority, out.maxStrict = 0, 0
	if !identity {
		out.maxPriority, out.maxStrict = 1<<31-1, 1<<32-1
	}
	if v := b.MaxPriority; v != nil {
		out.maxPriority = int32(*v)
	}
	if v := b.MaxStrictPriority; v != nil {
		out.maxStrict = uint32(*v)
	}
	if v := b.RequestQueueLimit; v != nil {
		out.requestLimit = uint64(*v)
	}
	if v := b.RawISLTokenQueueLimit; v != nil {
		out.rawLimit = uint64(*v)
	}
	return out
}

func compileTenants(c *Config, classes []drr.ClassConfig) compiledTenants {
	identity := c.Identity != nil
	out := compiledTenants{identity: c.Identity, exact: map[string]int{}}
	def := Rights{}
	if c.DefaultTenant != nil {
		def = *c.DefaultTenant
	}
	out.def = compileBinding("", &def, identity)
	for i := range c.Tenants {
		b := &c.Tenants[i]
		out.bindings = append(out.bindings, compileBinding(b.Name, &b.Rights, identity))
		out.prefixes = append(out.prefixes, b.Match.Prefix)
		for _, e := range b.Match.Exact {
			if _, ok := out.exact[e]; !ok {
				out.exact[e] = i
			}
		}
		if len(b.Match.Prefix) > 0 {
			out.prefixed = append(out.prefixed, i)
		}
		out.track = out.track || b.RequestQueueLimit != nil || b.RawISLTokenQueueLimit != nil
	}
	out.track = out.track || def.RequestQueueLimit != nil || def.RawISLTokenQueueLimit != nil
	for i := range classes {
		out.track = out.track || classes[i].TenantFairness
	}
	return out
}

// TenantRights is what a request's tenant may do: its queue identity
// (name, DRR weight, queue limits) and its binding's class and hint rules.
// The zero value allows everything and names no tenant.
type TenantRights struct {
	drr.Tenant
	// Binding is the matched binding; nil when the policy has no tenant
	// rules (any class, no caps).
	Binding *CompiledBinding
}

// Identity returns the policy's identity source, nil when none is
// configured.
func (c *Compiled) Identity() *Identity { return c.tenants.identity }

// Rights resolves the tenant of a request whose identity (or, without an
// identity source, whose x-laneway-tenant header) is id; "" means it
// brought none. The first binding that matches wins; an identity no
// binding matches gets the default binding, as its own tenant. It does not
// allocate.
func (c *Compiled) Rights(id string) TenantRights {
	ts := &c.tenants
	if id == "" {
		id = ts.identity.AnonymousTenant()
	}
	b := &ts.def
	first, ok := ts.exact[id]
	if !ok {
		first = len(ts.bindings)
	}
	for _, i := range ts.prefixed {
		if i >= first {
			break
		}
		for _, p := range ts.prefixes[i] {
			if strings.HasPrefix(id, p) {
				first = i
				break
			}
		}
	}
	name := id
	if first < len(ts.bindings) {
		b = &ts.bindings[first]
		name = b.Name
	}
	g := TenantRights{Binding: b}
	if ts.track {
		g.Tenant = drr.Tenant{Name: name, Weight: b.weight, RequestLimit: b.requestLimit, RawISLLimit: b.rawLimit}
	}
	return g
}

// CapPriority clamps a soft priority hint to the rights' cap.
func (r *TenantRights) CapPriority(p int32) int32 {
	if r.Binding == nil {
		return p
	}
	return min(p, r.Binding.maxPriority)
}

// CapStrict clamps a strict priority hint to the rights' cap.
func (r *TenantRights) CapStrict(s uint32) uint32 {
	if r.Binding == nil {
		return s
	}
	return min(s, r.Binding.maxStrict)
}

// ResolveFor is Resolve for a request of a tenant: a class header outside
// the binding's allowed classes is ignored, and a request that names no
// (allowed) class goes to the binding's default family. It does not
// allocate.
func (c *Compiled) ResolveFor(model, classHeader string, uncached uint64, g *TenantRights) int {
	b := g.Binding
	if b == nil || (b.allowed == nil && b.defaultFamily == "") {
		return c.Resolve(model, classHeader, uncached)
	}
	h := strings.TrimSpace(classHeader)
	if h != "" && b.allowed != nil && !b.allowed[h] {
		h = ""
	}
	if h == "" {
		h = b.defaultFamily
	}
	i := c.Resolve(model, h, uncached)
	if b.allowed != nil && !c.classAllowed(i, b) {
		// The header named something this profile does not have and the
		// profile's default is not allowed: the binding's default wins.
		i = c.Resolve(model, b.defaultFamily, uncached)
		if !c.classAllowed(i, b) {
			// Nor has the profile the binding's default: the first
			// allowed class it has (Validate makes sure of one).
			i = c.resolveAllowed(model, uncached, b, i)
		}
	}
	return i
}

// classAllowed reports whether class i is one the binding may use.
func (c *Compiled) classAllowed(i int, b *CompiledBinding) bool {
	in := &c.Info[i]
	if in.Family != "" {
		return b.allowed[in.Family]
	}
	return b.allowed[in.Name]
}
