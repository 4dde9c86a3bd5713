package sched

import (
	"fmt"
	"testing"

	"github.com/laneway-dev/laneway/pkg/drr"
)

func TestStatusOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"class limit", &drr.Rejection{Class: "c", Kind: drr.LimitRequests}, 429},
		{"tenant's own limit", &drr.Rejection{Class: "c", Kind: drr.LimitRequests, Tenant: "x"}, 429},
		{"tenant bound", &drr.Rejection{Class: "c", Kind: drr.LimitTenants, Tenant: "x"}, 429},
		{"shed, wrapped", fmt.Errorf("admit: %w", &ShedError{Class: "c"}), 429},
		{"no endpoint", &NoEndpointError{}, 503},
		{"shutting down", ErrShuttingDown, 503},
		{"cancelled", ErrCancelled, 503},
	}
	for _, tt := range tests {
		if got := StatusOf(tt.err); got != tt.want {
			t.Errorf("%s: StatusOf = %d, want %d", tt.name, got, tt.want)
		}
	}
}
