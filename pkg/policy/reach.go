package policy

import (
	"fmt"
	"slices"
	"strings"
)

// A binding's allowed classes must exist in every profile a request can
// resolve in: the root profile and each model profile. A request for a
// model is resolved in that model's profile only, so a profile with none
// of the binding's allowed classes could serve the binding's tenants only
// outside them; such a policy is refused rather than resolved anyway
// (the class would be the tenant's privilege escalation) or answered with
// an error per request (the operator would learn of it from clients).

// validateReach appends a problem for each profile of c in which none of
// allowed names a class (a family or an explicit class name); where names
// the binding. An empty allowed allows every class.
func validateReach(add func(Rule, string, ...any), where string, allowed []string, c *Config) {
	if len(allowed) == 0 {
		return
	}
	check := func(p *Profile, profile string) {
		classes := p.Classes
		if len(classes) == 0 {
			classes = []Class{SyntheticClass()}
		}
		var names []string
		for i := range classes {
			cl := &classes[i]
			if slices.Contains(allowed, cl.Family) || (cl.Explicit() && slices.Contains(allowed, cl.Name)) {
				return
			}
			names = append(names, cl.Name)
		}
		add(RuleTenant, "%s: allowed %v names no class of %s (its classes: %s): requests for it could only be served outside allowed; add one of its classes to allowed, or an allowed class to it",
			where, allowed, profile, strings.Join(names, ", "))
	}
	check(&c.Root, "the root profile")
	for i := range c.Models {
		check(&c.Models[i].Profile, fmt.Sprintf("model %q", c.Models[i].Model))
	}
}

// resolveAllowed resolves a request of a binding with allowed classes
// whose default family its model's profile lacks: the first allowed name
// the profile has, as the class header would. Validate makes sure there
// is one; without one it returns fallback.
func (c *Compiled) resolveAllowed(model string, uncached uint64, b *CompiledBinding, fallback int) int {
	r := c.profileOf(model)
	for _, a := range b.allowedOrder {
		_, explicit := r.explicit[a]
		_, family := r.families[a]
		if explicit || family {
			return c.Resolve(model, a, uncached)
		}
	}
	return fallback
}

// profileOf returns the resolver of model's profile: its model profile,
// else the root one.
func (c *Compiled) profileOf(model string) *resolver {
	if c.models != nil {
		if m, ok := c.models[model]; ok {
			return m
		}
	}
	return &c.root
}
