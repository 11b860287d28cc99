package service

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/lease"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

var recentT0 = time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC)

func TestRecentTopAndCounts(t *testing.T) {
	r := newRecent(recentT0.Add(-time.Hour), DefaultTopKeys)
	now := recentT0.Add(10 * time.Second)
	// acme is denied most, globex asks most, initech has no denial.
	for range 10 {
		r.record(now, "per-tenant", "per-tenant/acme", 100, 20)
		r.record(now, "per-tenant", "per-tenant/globex", 300, 290)
		r.record(now, "per-tenant", "per-tenant/initech", 50, 50)
		r.record(now, "per-ip", "per-ip/10.0.0.1", 70, 0)
	}
	top, window := r.top(now, "per-tenant", true, 10)
	if window != 5*time.Minute+10*time.Second {
		t.Errorf("window: got %v, want 5m10s", window)
	}
	if len(top) != 2 || top[0].StoreKey != "per-tenant/acme" || top[1].StoreKey != "per-tenant/globex" {
		t.Fatalf("top by denied of per-tenant: got %+v, want acme then globex", top)
	}
	checkEstimate(t, "acme denied", top[0].Count, top[0].Error, 800)
	checkEstimate(t, "acme admitted", top[0].Admitted, top[0].Error, 200)

	top, _ = r.top(now, "", false, 2)
	if len(top) != 2 || top[0].StoreKey != "per-tenant/globex" || top[1].StoreKey != "per-tenant/acme" {
		t.Fatalf("top 2 by demand of every rule: got %+v, want globex then acme", top)
	}
	if top[0].Rule != "per-tenant" {
		t.Errorf("rule of %s: got %q", top[0].StoreKey, top[0].Rule)
	}
	checkEstimate(t, "globex demand", top[0].Count, top[0].Error, 3000)

	c, errA, errD := r.counts(now, "per-ip/10.0.0.1")
	if !c.Tracked {
		t.Errorf("per-ip/10.0.0.1 not tracked")
	}
	checkEstimate(t, "10.0.0.1 denied", c.Denied, errD, 700)
	checkEstimate(t, "10.0.0.1 admitted", c.Admitted, errA, 0)
	if c, _, _ := r.counts(now, "per-ip/never"); c.Tracked {
		t.Errorf("a key never reported is tracked: %+v", c)
	}
}

// checkEstimate checks a count-min estimate: never below the truth, above
// it by at most the bound.
func checkEstimate(t *testing.T, what string, got, bound, want uint64) {
	t.Helper()
	if got < want || got > want+bound {
		t.Errorf("%s: got %d, want %d (+ at most %d)", what, got, want, bound)
	}
}

func TestRecentWindowForgets(t *testing.T) {
	r := newRecent(recentT0.Add(-time.Hour), DefaultTopKeys)
	r.record(recentT0, "r", "r/old", 10, 0)
	r.record(recentT0.Add(5*time.Minute), "r", "r/new", 10, 0)
	top, _ := r.top(recentT0.Add(5*time.Minute), "r", true, 10)
	if len(top) != 2 {
		t.Fatalf("five minutes on: got %+v, want both keys", top)
	}
	later := recentT0.Add(6 * time.Minute)
	top, _ = r.top(later, "r", true, 10)
	if len(top) != 1 || top[0].StoreKey != "r/new" {
		t.Fatalf("six minutes on: got %+v, want r/new alone", top)
	}
	// A slot reused for a new minute starts from zero.
	r.record(later, "r", "r/other", 1, 0)
	if c, _, _ := r.counts(later, "r/old"); c.Denied != 0 || c.Tracked {
		t.Errorf("r/old six minutes on: got %+v, want nothing", c)
	}
}

// TestRecentHeavyHitterAmongManyKeys: one key that takes a tenth of the
// denials is found first among 100,000 keys reported once each, and the
// summary's candidates stay bounded.
func TestRecentHeavyHitterAmongManyKeys(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	r := newRecent(recentT0.Add(-time.Hour), DefaultTopKeys)
	now := recentT0
	for i := range 100_000 {
		r.record(now, "r", "r/k"+strconv.Itoa(rng.IntN(1<<30)), 9, 0)
		if i%10 == 0 {
			r.record(now, "r", "r/heavy", 10, 0)
		}
	}
	top, _ := r.top(now, "r", true, 3)
	if len(top) == 0 || top[0].StoreKey != "r/heavy" {
		t.Fatalf("top: got %+v, want r/heavy first", top)
	}
	checkEstimate(t, "heavy", top[0].Count, top[0].Error, 100_000)
	for i := range r.shards {
		for j := range r.shards[i].slots {
			for _, rt := range r.shards[i].slots[j].rules {
				if len(rt.denied) > DefaultTopKeys || len(rt.demand) > DefaultTopKeys {
					t.Fatalf("candidates %d, %d: more than %d", len(rt.denied), len(rt.demand), DefaultTopKeys)
				}
			}
		}
	}
}

func TestRecentRulesBounded(t *testing.T) {
	r := newRecent(recentT0, DefaultTopKeys)
	for i := range recentMaxRules + 10 {
		rule := "rule" + strconv.Itoa(i)
		r.record(recentT0, rule, rule+"/k", 1, 0)
	}
	n := 0
	for i := range r.shards {
		n = max(n, len(r.shards[i].slots[slotOf(recentT0)%recentSlots].rules))
	}
	if n > recentMaxRules {
		t.Errorf("a shard's slot holds %d rules, more than %d", n, recentMaxRules)
	}
}

// BenchmarkRecentRecord is the cost the summary adds to each lease item,
// from parallel callers (as concurrent Lease calls): baseline=none records
// nothing.
func BenchmarkRecentRecord(b *testing.B) {
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("per-tenant/tenant-%d", i)
	}
	for _, c := range []struct {
		name string
		r    *recent
	}{{"baseline=none", nil}, {"summary", newRecent(recentT0, DefaultTopKeys)}} {
		b.Run(c.name, func(b *testing.B) {
			var next atomic.Uint64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := next.Add(1) * 7919
				for pb.Next() {
					i++
					c.r.record(recentT0, "per-tenant", keys[i%uint64(len(keys))], 10, 7)
				}
			})
		})
	}
}

// BenchmarkNoteItem is the whole of what a lease item's answer records for
// an operator (noteItem: the metrics by rule and the summary), from
// parallel callers: baseline=none records nothing.
func BenchmarkNoteItem(b *testing.B) {
	pol, err := policy.Parse("test.yaml", []byte(testPolicy))
	if err != nil {
		b.Fatal(err)
	}
	rule := pol.Rule("per-tenant")
	keys := make([]string, 4096)
	items := make([]*leasev1.LeaseItem, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("per-tenant/tenant-%d", i)
		items[i] = &leasev1.LeaseItem{Rule: "per-tenant", Key: keys[i][len("per-tenant/"):], Want: 10, Demand: 10, Admitted: 7}
	}
	s, err := New(Config{Region: "eu", Store: lease.NewMemoryStore(lease.MemoryConfig{}), Policy: pol, Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		note func(i uint64)
	}{
		{"baseline=none", func(uint64) {}},
		{"noteItem", func(i uint64) { s.noteItem(recentT0, rule, keys[i], items[i], 10) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			var next atomic.Uint64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := next.Add(1) * 7919
				for pb.Next() {
					i++
					c.note(i % uint64(len(keys)))
				}
			})
		})
	}
}

func TestRecentDisabled(t *testing.T) {
	r := newRecent(recentT0, -1)
	if r != nil {
		t.Fatalf("newRecent with k -1: got a summary")
	}
	r.record(recentT0, "r", "r/k", 10, 0)
	if top, _ := r.top(recentT0, "", true, 10); top != nil {
		t.Errorf("top without a summary: got %v", top)
	}
	if c, _, _ := r.counts(recentT0, "r/k"); c != (RecentCounts{}) {
		t.Errorf("counts without a summary: got %+v", c)
	}
}

// TestNoteItemCountsWaitingRequestsAdmitted: a request waiting for its
// lease call is in the call's demand but not yet admitted; a grant admits
// it (the agent reports it admitted with its next call), so it is neither
// denied nor counted twice. What an agent denied itself, and everything of
// an ask the region granted nothing for, is denied.
func TestNoteItemCountsWaitingRequestsAdmitted(t *testing.T) {
	pol, err := policy.Parse("test.yaml", []byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	rule := pol.Rule("per-tenant")
	s, err := New(Config{Region: "eu", Store: lease.NewMemoryStore(lease.MemoryConfig{}), Policy: pol, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	item := func(key string, demand, admitted int64) *leasev1.LeaseItem {
		return &leasev1.LeaseItem{Rule: "per-tenant", Key: key, Want: 10, Demand: demand, Admitted: admitted}
	}
	now := recentT0.Add(time.Second)
	// A cold key's first ask (1 waiting), granted; its next call reports it
	// admitted beside a new waiting request, granted again.
	s.noteItem(now, rule, "per-tenant/cold", item("cold", 1, 0), 10)
	s.noteItem(now, rule, "per-tenant/cold", item("cold", 1, 1), 10)
	// A hot key whose agent denied 4 of 10 from a spent lease, then asked
	// for 3 more that the region refused.
	s.noteItem(now, rule, "per-tenant/hot", item("hot", 11, 6), 1)
	s.noteItem(now, rule, "per-tenant/hot", item("hot", 3, 0), 0)
	for _, c := range []struct {
		key              string
		admitted, denied uint64
	}{{"per-tenant/cold", 1, 0}, {"per-tenant/hot", 6, 4 + 3}} {
		got := s.Recent(now, c.key)
		if got.Admitted != c.admitted || got.Denied != c.denied {
			t.Errorf("%s: got admitted %d denied %d, want %d and %d", c.key, got.Admitted, got.Denied, c.admitted, c.denied)
		}
	}
}
