// Package policy is Laneway's policy model (SPEC §2, §6): which physical
// class a request belongs to, what each class's DRR and busy-test
// parameters are, and which priority hints a request carries.
//
// One model, two sources. Config is loaded either from a policy YAML file
// in the reference router's format (LoadYAML, strict: an unknown key at any
// level is an error) or from a pool's PolicyClass and PolicyProfile objects
// (FromObjects, CheckObjects). Both paths end in the same Config.Validate,
// so a rule is written once and its message is the same in a file error
// and in a status condition. ToObjects goes the other way, for
// `laneway convert`.
//
// Config.Compile turns a valid Config into a Compiled policy: the
// []drr.ClassConfig the scheduler takes, the per-class busy tests
// (BusyTest, same index), and precomputed lookup tables so that
// Compiled.Resolve, which runs once per request, does no allocation.
//
// Config.Describe writes what a valid Config does, a line per compiled
// class and per tenant rule, as `laneway validate` prints it.
//
// Tenants (SPEC §14, tenants.go): an Identity says where a request's tenant
// comes from; each TenantBinding names the tenant of the identities it
// matches and grants it Rights; Config.DefaultTenant is the Rights of every
// other identity, with no name or match of its own.
//
// Hints merges the priority hints of one request: the body's, which
// tokenize.Extract reads in its single pass over the body
// (Hints.ApplyAgentHints), and the headers' (HeaderHints), which override
// them; ForwardPriority converts the soft priority to the polarity of the
// backend engine.
//
// Model profiles: Config.Models maps an exact model name to a whole Profile
// that replaces the root one for that model's requests. All profiles'
// classes share one DRR ring (they share the pool's endpoints); a model
// profile's class is named "<model>/<class>" in the drr slice so that names
// stay unique (a class name cannot contain "/").
package policy
