package policy

import (
	"fmt"
	"strings"
	"testing"
)

// benchSet is a realistic policy of n rules: a per-tenant and a per-IP
// limit, then per-route limits (some per plan), the shape that grows to
// hundreds of rules in practice.
func benchSet(b *testing.B, n int) *Set {
	var sb strings.Builder
	sb.WriteString("rules:\n")
	sb.WriteString("  - {name: per-tenant, key: [tenant], limit: 1000}\n")
	sb.WriteString("  - {name: per-ip, key: [ip], limit: 20, scope: region, on_error: open}\n")
	for i := 2; i < n; i++ {
		method := []string{"GET", "POST"}[i%2]
		if i%10 == 0 {
			fmt.Fprintf(&sb, "  - {name: r%d, match: {route: /v1/r%d, method: %s, plan: pro}, key: [tenant, plan], limit: 500, cost: 5}\n", i, i/2, method)
			continue
		}
		fmt.Fprintf(&sb, "  - {name: r%d, match: {route: /v1/r%d, method: %s}, key: [tenant], limit: 500}\n", i, i/2, method)
	}
	return mustParse(b, sb.String())
}

// BenchmarkMatch compares the indexed Match with checking every rule in
// turn, for a small and a large policy. Both report 0 allocs/op.
func BenchmarkMatch(b *testing.B) {
	for _, n := range []int{10, 500} {
		s := benchSet(b, n)
		ds := []Descriptor{
			{"tenant", "acme"}, {"route", fmt.Sprintf("/v1/r%d", n/4)}, {"method", "POST"},
			{"ip", "192.0.2.1"}, {"plan", "pro"},
		}
		want := len(naiveMatch(s, ds))
		dst := make([]*Rule, 0, 16)
		b.Run(fmt.Sprintf("rules=%d/ration", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				dst = s.Match(dst[:0], ds)
			}
			if len(dst) != want {
				b.Fatalf("Match: got %d rules, want %d", len(dst), want)
			}
		})
		b.Run(fmt.Sprintf("rules=%d/baseline=linear-scan", n), func(b *testing.B) {
			b.ReportAllocs()
			rules := s.Rules()
			for b.Loop() {
				dst = dst[:0]
				for _, r := range rules {
					if r.Applies(ds) {
						dst = append(dst, r)
					}
				}
			}
			if len(dst) != want {
				b.Fatalf("linear scan: got %d rules, want %d", len(dst), want)
			}
		})
	}
}

func BenchmarkAppendKey(b *testing.B) {
	r := &Rule{Key: []string{"tenant", "route"}}
	for _, tc := range []struct {
		name string
		ds   []Descriptor
	}{
		{"plain", []Descriptor{{"method", "POST"}, {"route", "/v1/transfers"}, {"tenant", "acme-corporation"}}},
		{"escaped", []Descriptor{{"method", "POST"}, {"route", "/v1/a b,c=d"}, {"tenant", "{acme}%"}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 128)
			for b.Loop() {
				buf = r.AppendKey(buf[:0], tc.ds)
			}
		})
	}
}
