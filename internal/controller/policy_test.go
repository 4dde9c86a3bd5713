package controller

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/policy"
)

func TestSummarizeTenants(t *testing.T) {
	tests := []struct {
		name string
		cfg  *policy.Config
		want *TenantSummary
	}{
		{"nothing applied yet", nil, nil},
		{"no identity", &policy.Config{}, &TenantSummary{Identity: "none (client hints trusted)"}},
		{"header", &policy.Config{Identity: &policy.Identity{Header: "x-tenant-id"}, Tenants: make([]policy.TenantBinding, 3)},
			&TenantSummary{Identity: "header x-tenant-id", Bindings: 3}},
		{"metadata then header", &policy.Config{Identity: &policy.Identity{Header: "x-tenant-id",
			MetadataNamespace: "envoy.filters.http.jwt_authn", MetadataPath: []string{"p", "sub"}}},
			&TenantSummary{Identity: "metadata envoy.filters.http.jwt_authn/p.sub, then header x-tenant-id"}},
	}
	for _, tt := range tests {
		got := summarizeTenants(tt.cfg)
		if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
