package envoyrls

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/lease/agent/internal/leaseserver"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy/envoyimport"
)

// frozen is the instant of every decision in these tests: 10:00:00.2 UTC,
// well inside every second, minute, hour and day window, so that counts
// never straddle two windows.
var frozen = time.Date(2026, 12, 2, 10, 0, 0, 200_000_000, time.UTC)

// newServer runs the policy doc on a real lease service over the memory
// store, an agent leasing from it, and a Server deciding with the agent,
// all at the frozen instant.
func newServer(t *testing.T, doc string, cfg Config) *Server {
	t.Helper()
	clock := func() time.Time { return frozen }
	store := lease.NewMemoryStore(lease.MemoryConfig{Clock: clock})
	r := leaseserver.Start(t, doc, service.Config{Clock: clock, Store: store, LeaseTTL: time.Hour})
	a, err := agent.New(agent.Config{Target: r.Addr, Logger: leaseserver.Quiet(), RoundTripTimeout: 5 * time.Second, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.WaitPolicy(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := New(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// desc builds an Envoy descriptor from "k=v" entries.
func desc(entries ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

// envoyConfig exercises every construct the importer converts. The
// comments state what Envoy's rate limit service does, per its README.
const envoyConfig = `
domain: edge
descriptors:
  # A level without a limit, and below it a limit per value of subkey1
  # (no value: each value has its own counter), which an exact value
  # overrides with its own.
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 2}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 4}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unit: minute, requests_per_unit: 6}
  # An exact value without a limit whitelists it, and so does unlimited.
  - key: remote_address
    value: 10.0.0.2
  - key: remote_address
    value: 10.0.0.3
    rate_limit: {unlimited: true}
  # "*" matches every value, each with its own counter; a limit applies
  # only to descriptors of its own depth.
  - key: user
    value: "*"
    rate_limit: {unit: hour, requests_per_unit: 2}
    descriptors:
      - key: path
        rate_limit: {unit: day, requests_per_unit: 1}
  # A trailing * matches a prefix, each value with its own counter, after
  # the exact values and before the key alone; the first pattern that
  # matches wins. share_threshold gives all of a pattern's values one.
  - key: path
    value: /api/admin/*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/health
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: file
    value: docs/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: shadowed
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    rate_limit: {name: tenant, unit: minute, requests_per_unit: 1}
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 5
      replaces:
        - name: tenant
`

// TestImportedDecisions runs a converted Envoy configuration through the
// real decision path (this adapter, an agent, a lease service over the
// memory store) and checks that each request is decided as Envoy's rate
// limit service documents for the original configuration.
func TestImportedDecisions(t *testing.T) {
	res, err := envoyimport.Convert([]envoyimport.File{{Name: "edge.yaml", Data: []byte(envoyConfig)}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := newServer(t, string(res.Set.Source()), Config{Registerer: reg})
	ctx := context.Background()
	type step struct {
		why     string
		domain  string
		descs   []*ratelimitv3.RateLimitDescriptor
		n       int   // requests sent
		allowed []int // requests answered OK per descriptor
		rule    string
	}
	steps := []step{
		{"a value of subkey1 gets the limit of the node without value", "edge", ds(desc("key1=value1", "subkey1=a")), 4, []int{2}, "edge.key1_value1.subkey1"},
		{"another value has a counter of its own", "edge", ds(desc("key1=value1", "subkey1=b")), 3, []int{2}, "edge.key1_value1.subkey1"},
		{"the exact value's node wins over the node without value", "edge", ds(desc("key1=value1", "subkey1=subvalue1")), 6, []int{4}, "edge.key1_value1.subkey1_subvalue1"},
		{"the parent level has no limit", "edge", ds(desc("key1=value1")), 3, []int{3}, ""},
		{"a descriptor deeper than the tree has no limit", "edge", ds(desc("key1=value1", "subkey1=a", "extra=x")), 3, []int{3}, ""},
		{"entries are walked in order", "edge", ds(desc("subkey1=c", "key1=value1")), 3, []int{3}, ""},
		{"a value the tree does not list at the top has no node", "edge", ds(desc("key1=other", "subkey1=a")), 3, []int{3}, ""},
		{"any address: the node without value", "edge", ds(desc("remote_address=192.0.2.1")), 5, []int{3}, "edge.remote_address"},
		{"a listed address: its own limit", "edge", ds(desc("remote_address=10.0.0.1")), 8, []int{6}, "edge.remote_address_10-0-0-1"},
		{"a listed address without a limit is whitelisted", "edge", ds(desc("remote_address=10.0.0.2")), 5, []int{5}, ""},
		{"an unlimited address is whitelisted", "edge", ds(desc("remote_address=10.0.0.3")), 5, []int{5}, ""},
		{"* limits each value", "edge", ds(desc("user=u1")), 3, []int{2}, "edge.user_-"},
		{"the child's limit alone applies to the deeper descriptor", "edge", ds(desc("user=u1", "path=/x")), 2, []int{1}, "edge.user_-.path"},
		{"the first pattern that matches", "edge", ds(desc("path=/api/admin/x")), 2, []int{1}, "edge.path_-api-admin--"},
		{"a later pattern, for the values the first does not match", "edge", ds(desc("path=/api/users")), 3, []int{2}, "edge.path_-api--"},
		{"each value of a pattern has its own counter", "edge", ds(desc("path=/api/orders")), 3, []int{2}, "edge.path_-api--"},
		{"an exact value wins over a pattern", "edge", ds(desc("path=/api/health")), 3, []int{3}, ""},
		{"no pattern matches: the key alone", "edge", ds(desc("path=/web")), 5, []int{4}, "edge.path"},
		{"share_threshold: one counter for the pattern", "edge", ds(desc("file=docs/a")), 2, []int{2}, "edge.file_docs--"},
		{"share_threshold: another value spends the same", "edge", ds(desc("file=docs/b")), 2, []int{1}, "edge.file_docs--"},
		{"a shadow limit never denies", "edge", ds(desc("shadowed=s")), 3, []int{3}, "edge.shadowed"},
		{"vip replaces tenant in the same request: tenant is not counted", "edge", ds(desc("tenant=t1"), desc("vip=v")), 3, []int{3, 3}, "edge.vip"},
		{"tenant alone: its counter was not touched", "edge", ds(desc("tenant=t1")), 2, []int{1}, "edge.tenant"},
		{"another domain has no limits", "other", ds(desc("remote_address=192.0.2.1")), 4, []int{4}, ""},
	}
	for _, st := range steps {
		got := make([]int, len(st.descs))
		var last *rlsv3.RateLimitResponse
		for range st.n {
			resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: st.domain, Descriptors: st.descs})
			if err != nil {
				t.Fatalf("%s: %v", st.why, err)
			}
			overall := rlsv3.RateLimitResponse_OK
			for i, ds := range resp.GetStatuses() {
				if ds.GetCode() == rlsv3.RateLimitResponse_OK {
					got[i]++
				} else {
					overall = rlsv3.RateLimitResponse_OVER_LIMIT
				}
			}
			if resp.GetOverallCode() != overall {
				t.Errorf("%s: overall %v, want %v from the statuses", st.why, resp.GetOverallCode(), overall)
			}
			last = resp
		}
		if fmt.Sprint(got) != fmt.Sprint(st.allowed) {
			t.Errorf("%s: %d requests, OK per descriptor %v, want %v", st.why, st.n, got, st.allowed)
		}
		rule := ""
		for _, ds := range last.GetStatuses() {
			if n := ds.GetCurrentLimit().GetName(); n != "" {
				rule = n
			}
		}
		if rule != st.rule {
			t.Errorf("%s: limit named %q, want %q", st.why, rule, st.rule)
		}
	}
	if got := testutil.ToFloat64(s.m.shadow); got != 2 {
		t.Errorf("shadow descriptors counted %v, want 2 (the 2nd and 3rd shadowed requests)", got)
	}
	if got := testutil.ToFloat64(s.m.replaced); got != 3 {
		t.Errorf("replaced descriptors counted %v, want 3", got)
	}
}

func ds(d ...*ratelimitv3.RateLimitDescriptor) []*ratelimitv3.RateLimitDescriptor { return d }
