package e2e

import (
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// hintHeaders are the class and priority headers a client may send (SPEC
// §6), from the code that reads them.
var hintHeaders = []string{
	policy.HeaderPolicyClass, policy.HeaderDynamoPolicyClass, policy.HeaderPriority,
	policy.HeaderStrictPriority, policy.HeaderDynamoPriority, policy.HeaderDynamoStrictPriority,
}

// jwtNamespace is the dynamic metadata namespace Envoy's jwt_authn filter
// writes verified payloads to.
const jwtNamespace = "envoy.filters.http.jwt_authn"

// TestChartEnvoyIdentity: with policy.profile.identity set, the chart's
// Envoy removes the client's copies of the identity, tenant, class and
// priority headers in a filter that runs before jwt_authn (so the headers
// jwt_authn sets from a verified token survive) and before ext_proc (so
// the picker never sees a client's copy); with a JWT provider, ext_proc
// forwards jwt_authn's metadata namespace and the provider writes its
// payload under the name identity.metadata.path starts with. Without
// identity nothing is removed (TestChartEnvoyConfig checks that chain).
func TestChartEnvoyIdentity(t *testing.T) {
	sets := ciValueSets(t)
	tenants := []string{sets["tenants"]}
	tests := []struct {
		name    string
		render  renderArgs
		filters []string // the inference listener's chain
		strip   []string // headers removed, in order
		forward []string // forwarded metadata namespaces
		check   func(t *testing.T, jwt *jwtauthnv3.JwtAuthentication, clusters map[string]*clusterv3.Cluster)
	}{
		{
			name:    "remote JWKS; client hints stripped",
			render:  renderArgs{release: "gw", namespace: "edge", valuesFiles: tenants},
			filters: []string{"envoy.filters.http.header_mutation", jwtNamespace, "envoy.filters.http.ext_proc", "envoy.filters.http.router"},
			strip:   append([]string{"x-tenant-id", policy.TenantHeader}, hintHeaders...),
			forward: []string{extproc.MetadataNamespaceSubset, extproc.MetadataNamespaceLB, jwtNamespace},
			check: func(t *testing.T, jwt *jwtauthnv3.JwtAuthentication, clusters map[string]*clusterv3.Cluster) {
				p := jwt.GetProviders()["my-provider"]
				if p.GetIssuer() != "https://auth.example.com" || !slices.Equal(p.GetAudiences(), []string{"laneway"}) || p.GetPayloadInMetadata() != "my-provider" {
					t.Errorf("provider my-provider: %v", p)
				}
				var claims [][2]string
				for _, c := range p.GetClaimToHeaders() {
					claims = append(claims, [2]string{c.GetClaimName(), c.GetHeaderName()})
				}
				if want := [][2]string{{"org", "x-tenant-id"}, {"tier", policy.HeaderPolicyClass}}; !slices.Equal(claims, want) {
					t.Errorf("claim_to_headers %v, want %v", claims, want)
				}
				uri := p.GetRemoteJwks().GetHttpUri()
				if uri.GetUri() != "https://auth.example.com/.well-known/jwks.json" || uri.GetCluster() != "laneway_jwks" {
					t.Errorf("remote JWKS %v", uri)
				}
				// The keys decide who a caller is: fetched over TLS whose
				// server is verified, by name.
				c := clusters["laneway_jwks"]
				sa := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
				if sa.GetAddress() != "auth.example.com" || sa.GetPortValue() != 443 {
					t.Errorf("laneway_jwks targets %s:%d", sa.GetAddress(), sa.GetPortValue())
				}
				var tlsCtx tlsv3.UpstreamTlsContext
				unpackValid(t, "laneway_jwks TLS", c.GetTransportSocket().GetTypedConfig(), &tlsCtx)
				vc := tlsCtx.GetCommonTlsContext().GetValidationContext()
				sans := vc.GetMatchTypedSubjectAltNames()
				if tlsCtx.GetSni() != "auth.example.com" || vc.GetTrustedCa().GetFilename() == "" || len(sans) != 1 || sans[0].GetMatcher().GetExact() != "auth.example.com" {
					t.Errorf("laneway_jwks TLS does not verify auth.example.com: %v", &tlsCtx)
				}
				// allowMissing: no token is the anonymous tenant.
				reqs := jwt.GetRules()[0].GetRequires().GetRequiresAny().GetRequirements()
				if len(reqs) != 2 || reqs[0].GetProviderName() != "my-provider" || reqs[1].GetAllowMissing() == nil {
					t.Errorf("rules %v, want my-provider or allow_missing", jwt.GetRules())
				}
			},
		},
		{
			name: "local JWKS and a token required; clients pick among allowed classes",
			render: renderArgs{release: "gw", namespace: "edge", valuesFiles: tenants, values: `
envoy:
  stripClientHints: false
  jwt: {remoteJwksUri: "", localJwks: '{"keys":[]}', allowMissing: false}
`},
			filters: []string{"envoy.filters.http.header_mutation", jwtNamespace, "envoy.filters.http.ext_proc", "envoy.filters.http.router"},
			strip:   []string{"x-tenant-id", policy.TenantHeader},
			forward: []string{extproc.MetadataNamespaceSubset, extproc.MetadataNamespaceLB, jwtNamespace},
			check: func(t *testing.T, jwt *jwtauthnv3.JwtAuthentication, clusters map[string]*clusterv3.Cluster) {
				p := jwt.GetProviders()["my-provider"]
				if p.GetLocalJwks().GetInlineString() != `{"keys":[]}` || p.GetRemoteJwks() != nil {
					t.Errorf("provider keys: %v", p)
				}
				if _, ok := clusters["laneway_jwks"]; ok {
					t.Error("a JWKS cluster without a remote JWKS")
				}
				if got := jwt.GetRules()[0].GetRequires().GetProviderName(); got != "my-provider" {
					t.Errorf("rules %v, want my-provider required", jwt.GetRules())
				}
			},
		},
		{
			name: "identity from a header another proxy sets without JWT",
			render: renderArgs{release: "gw", namespace: "edge", values: `
envoy: {enabled: true}
policy:
  profile:
    identity: {header: x-caller, metadata: {namespace: com.example.auth, path: [user]}}
`},
			filters: []string{"envoy.filters.http.header_mutation", "envoy.filters.http.ext_proc", "envoy.filters.http.router"},
			strip:   append([]string{"x-caller", policy.TenantHeader}, hintHeaders...),
			forward: []string{extproc.MetadataNamespaceSubset, extproc.MetadataNamespaceLB, "com.example.auth"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, bs := envoyBootstrap(t, render(t, tc.render), "gw-laneway-envoy")
			filters := envoyListeners(t, bs)["inference"].GetHttpFilters()
			var names []string
			for _, f := range filters {
				names = append(names, f.GetName())
			}
			if !slices.Equal(names, tc.filters) {
				t.Fatalf("inference listener filters %v, want %v", names, tc.filters)
			}
			var hm headermutationv3.HeaderMutation
			unpackValid(t, "header_mutation filter", filters[0].GetTypedConfig(), &hm)
			var removed []string
			for _, m := range hm.GetMutations().GetRequestMutations() {
				removed = append(removed, m.GetRemove())
			}
			if !slices.Equal(removed, tc.strip) {
				t.Errorf("removed request headers %v, want %v", removed, tc.strip)
			}
			if len(hm.GetMutations().GetResponseMutations()) > 0 {
				t.Errorf("response headers mutated: %v", hm.GetMutations())
			}
			var ep extprocfilterv3.ExternalProcessor
			unpackValid(t, "ext_proc filter", filters[len(filters)-2].GetTypedConfig(), &ep)
			if fwd := ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(); !slices.Equal(fwd, tc.forward) {
				t.Errorf("forwarded metadata namespaces %v, want %v", fwd, tc.forward)
			}
			if tc.check != nil {
				var jwt jwtauthnv3.JwtAuthentication
				unpackValid(t, "jwt_authn filter", filters[1].GetTypedConfig(), &jwt)
				tc.check(t, &jwt, envoyClusters(bs))
			}
		})
	}
}
