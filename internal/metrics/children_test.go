package metrics

import (
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestChildren(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"k"})
	made := map[string]int{}
	var mu sync.Mutex
	c := NewChildren(func(k string) prometheus.Counter {
		mu.Lock()
		made[k]++
		mu.Unlock()
		return vec.WithLabelValues(k)
	})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 100 {
				c.Get("k" + strconv.Itoa((w+i)%5)).Inc()
			}
		})
	}
	wg.Wait()
	tests := []struct {
		key  string
		want float64
	}{{"k0", 160}, {"k1", 160}, {"k2", 160}, {"k3", 160}, {"k4", 160}}
	for _, tc := range tests {
		if got := testutil.ToFloat64(vec.WithLabelValues(tc.key)); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.key, got, tc.want)
		}
		if made[tc.key] != 1 {
			t.Errorf("%s made %d times, want once", tc.key, made[tc.key])
		}
	}
	if n := testutil.CollectAndCount(vec); n != 5 {
		t.Errorf("%d series, want 5: a key is made only when first used", n)
	}
}

// TestChildrenRetain: dropped keys leave the cache and, through drop, the
// vector; a later Get makes a fresh child at zero.
func TestChildrenRetain(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"k"})
	c := NewChildren(func(k string) prometheus.Counter { return vec.WithLabelValues(k) })
	for _, k := range []string{"a", "b", "c"} {
		c.Get(k).Add(2)
	}
	var dropped []string
	c.Retain(func(k string) bool { return k == "b" }, func(k string) {
		dropped = append(dropped, k)
		vec.DeleteLabelValues(k)
	})
	slices.Sort(dropped)
	if !slices.Equal(dropped, []string{"a", "c"}) {
		t.Errorf("dropped %v, want [a c]", dropped)
	}
	if n := testutil.CollectAndCount(vec); n != 1 {
		t.Errorf("%d series after Retain, want 1", n)
	}
	c.Get("a").Inc()
	if got := testutil.ToFloat64(vec.WithLabelValues("a")); got != 1 {
		t.Errorf("a after it came back = %v, want 1 (a fresh series)", got)
	}
	if got := testutil.ToFloat64(vec.WithLabelValues("b")); got != 2 {
		t.Errorf("kept b = %v, want 2", got)
	}
}

// TestChildrenGetIf: an existing child is returned whatever allowed says;
// a missing one is made only for an allowed key, so a key that left (and
// is no longer allowed) gets no series back.
func TestChildrenGetIf(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"k"})
	c := NewChildren(func(k string) prometheus.Counter { return vec.WithLabelValues(k) })
	live := map[string]bool{"a": true}
	allowed := func(k string) bool { return live[k] }
	if _, ok := c.GetIf("a", allowed); !ok {
		t.Fatal("GetIf of an allowed key made no child")
	}
	delete(live, "a")
	if _, ok := c.GetIf("a", allowed); !ok {
		t.Error("GetIf dropped an existing child because its key is no longer allowed")
	}
	c.Retain(func(k string) bool { return live[k] }, func(k string) { vec.DeleteLabelValues(k) })
	if _, ok := c.GetIf("a", allowed); ok {
		t.Error("GetIf brought back a key that left")
	}
	if n := testutil.CollectAndCount(vec); n != 0 {
		t.Errorf("%d series after the key left, want 0", n)
	}
}

// BenchmarkChildren compares a cached child with the vector's own lookup.
func BenchmarkChildren(b *testing.B) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"class", "queued"})
	b.Run("WithLabelValues", func(b *testing.B) {
		for b.Loop() {
			vec.WithLabelValues("premium", "false").Inc()
		}
	})
	c := NewChildren(func(k string) prometheus.Counter { return vec.WithLabelValues(k, "false") })
	b.Run("Children", func(b *testing.B) {
		for b.Loop() {
			c.Get("premium").Inc()
		}
	})
}
