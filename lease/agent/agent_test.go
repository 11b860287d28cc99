package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/lease/agent/internal/leaseserver"
	"github.com/ration-dev/ration/lease/service"
)

// startSemanticServer is a lease server whose leases last a minute: the tests
// that use it are about decisions, not expiry, and must not lose tokens to
// expiry when a race-enabled run on a busy machine is slow.
func startSemanticServer(t testing.TB, doc string, store service.Store) *leaseserver.Server {
	t.Helper()
	return startLeaseServerWith(t, doc, store, service.Config{LeaseTTL: time.Minute})
}

// testConfig gives round trips a generous deadline, so that a slow
// race-enabled run on a small machine never mistakes a slow region for a
// dead one in tests that are not about that.
func testConfig() Config {
	return Config{RoundTripTimeout: time.Second, RefreshTimeout: time.Second}
}

const slowPolicy = `
rules:
  - name: per-tenant
    key: [tenant]
    limit: 10
    period: 1h
`

func TestAllowGrantsUpToTheLimitThenDenies(t *testing.T) {
	r := startSemanticServer(t, slowPolicy, nil)
	a := newAgent(t, r, testConfig())
	ctx := context.Background()
	allowed := 0
	for i := 0; i < 15; i++ {
		d := a.Allow(ctx, ds("tenant", "acme"), 1)
		if d.Rule != "per-tenant" || d.Limit != 10 || d.Period != time.Hour {
			t.Fatalf("request %d: got rule %q limit %d period %v, want per-tenant 10 1h", i, d.Rule, d.Limit, d.Period)
		}
		if d.Allowed {
			allowed++
			if d.Path != PathLease {
				t.Errorf("request %d allowed by path %v, want LEASE", i, d.Path)
			}
			continue
		}
		if d.RetryAfter <= 0 || (d.Path != PathLease && d.Path != PathDenyCache) {
			t.Errorf("request %d denied with path %v retry %v, want LEASE or DENY_CACHE and a retry", i, d.Path, d.RetryAfter)
		}
	}
	if allowed != 10 {
		t.Errorf("allowed %d of 15, want 10", allowed)
	}
	// A key nobody's rule matches is allowed without a rule.
	if d := a.Allow(ctx, ds("user", "x"), 1); !d.Allowed || d.Rule != "" || d.Path != PathNone {
		t.Errorf("unmatched request got %+v, want allowed, no rule, NONE", d)
	}
}

func TestDenyCacheAnswersWithoutRoundTrips(t *testing.T) {
	r := startSemanticServer(t, slowPolicy, nil)
	a := newAgent(t, r, testConfig())
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		if d := a.Allow(ctx, ds("tenant", "acme"), 1); !d.Allowed {
			t.Fatalf("request %d denied: %+v", i, d)
		}
	}
	// A partial grant holds the key off for part of a lease period only
	// (holdAfter), which a slow run may outlast; the region's refusal of
	// a whole grant holds it for the bucket's refill time, minutes here.
	deadline := time.Now().Add(10 * time.Second)
	for d := a.Allow(ctx, ds("tenant", "acme"), 1); d.RetryAfter < time.Minute; d = a.Allow(ctx, ds("tenant", "acme"), 1) {
		if d.Allowed || time.Now().After(deadline) {
			t.Fatalf("after 10 requests got %+v, want a denial holding for minutes", d)
		}
	}
	calls := a.Stats().LeaseCalls
	for i := 0; i < 100; i++ {
		d := a.Allow(ctx, ds("tenant", "acme"), 1)
		if d.Allowed || d.Path != PathDenyCache || d.RetryAfter <= 0 {
			t.Fatalf("denied request %d got %+v, want a DENY_CACHE denial with a retry", i, d)
		}
	}
	if got := a.Stats().LeaseCalls; got != calls {
		t.Errorf("deny cache made %d lease calls, want 0", got-calls)
	}
}

func TestAllRulesMustPassAndDenialsSpendNothing(t *testing.T) {
	r := startSemanticServer(t, `
rules:
  - name: tenant
    key: [tenant]
    limit: 20
    period: 1h
  - name: route
    key: [route]
    limit: 3
    period: 1h
`, nil)
	a := newAgent(t, r, testConfig())
	ctx := context.Background()
	var got []bool
	for i := 0; i < 6; i++ {
		got = append(got, a.Allow(ctx, ds("tenant", "acme", "route", "/x"), 1).Allowed)
	}
	if diff := cmp.Diff([]bool{true, true, true, false, false, false}, got); diff != "" {
		t.Errorf("allowed (-want +got):\n%s", diff)
	}
	d := a.Allow(ctx, ds("tenant", "acme", "route", "/x"), 1)
	if d.Rule != "route" {
		t.Errorf("denial decided by %q, want route", d.Rule)
	}
	// The three denied requests took nothing from the tenant's 20.
	n := 0
	for i := 0; i < 30; i++ {
		if a.Allow(ctx, ds("tenant", "acme", "route", "/y"), 1).Allowed {
			n++
		}
	}
	// /y has its own route limit of 3, so n is 3; the tenant alone then
	// has 20 − 3 (/x) − 3 (/y) left.
	m := 0
	for i := 0; i < 30; i++ {
		if a.Allow(ctx, ds("tenant", "acme"), 1).Allowed {
			m++
		}
	}
	if n+m != 17 {
		t.Errorf("tenant admitted %d more after 3, want 17: denied requests must not spend", n+m)
	}
}

func TestTightestRuleSetsTheDecision(t *testing.T) {
	r := startSemanticServer(t, `
rules:
  - name: loose
    key: [tenant]
    limit: 1000
    period: 1h
  - name: tight
    key: [route]
    limit: 5
    period: 1h
`, nil)
	a := newAgent(t, r, testConfig())
	d := a.Allow(context.Background(), ds("tenant", "acme", "route", "/x"), 1)
	if !d.Allowed || d.Rule != "tight" || d.Limit != 5 || d.Remaining > 4 {
		t.Errorf("got %+v, want allowed by the tight rule with at most 4 remaining", d)
	}
	if d.Reset <= 0 || d.Reset > time.Hour {
		t.Errorf("reset %v, want within (0, 1h]", d.Reset)
	}
}

func TestShadowRulesNeverDeny(t *testing.T) {
	r := startSemanticServer(t, `
rules:
  - name: trial
    key: [tenant]
    limit: 2
    period: 1h
    shadow: true
`, nil)
	a := newAgent(t, r, testConfig())
	var paths []Path
	for i := 0; i < 4; i++ {
		d := a.Allow(context.Background(), ds("tenant", "acme"), 1)
		if !d.Allowed {
			t.Fatalf("request %d denied by a shadow rule: %+v", i, d)
		}
		paths = append(paths, d.Path)
	}
	// A shadow rule that passes decides nothing (NONE); one that would deny
	// is reported (SHADOW).
	if diff := cmp.Diff([]Path{PathNone, PathNone, PathShadow, PathShadow}, paths); diff != "" {
		t.Errorf("paths (-want +got):\n%s", diff)
	}
}

func TestCostAndHits(t *testing.T) {
	r := startSemanticServer(t, `
rules:
  - name: expensive
    key: [tenant]
    limit: 100
    period: 1h
    cost: 10
`, nil)
	a := newAgent(t, r, testConfig())
	ctx := context.Background()
	if d := a.Allow(ctx, ds("tenant", "acme"), 3); !d.Allowed { // 30 tokens
		t.Fatalf("3 hits denied: %+v", d)
	}
	if d := a.Allow(ctx, ds("tenant", "acme"), 7); !d.Allowed { // 70 more: 100
		t.Fatalf("7 hits denied: %+v", d)
	}
	if d := a.Allow(ctx, ds("tenant", "acme"), 1); d.Allowed {
		t.Errorf("101st..110th token allowed: %+v", d)
	}
	// A request bigger than the whole bucket is denied without asking, and
	// an absurd hit count does not overflow.
	calls := a.Stats().LeaseCalls
	for _, hits := range []int64{11, 1 << 62} {
		if d := a.Allow(ctx, ds("tenant", "other"), hits); d.Allowed || d.Rule != "expensive" {
			t.Errorf("%d hits got %+v, want a denial by expensive", hits, d)
		}
	}
	if got := a.Stats().LeaseCalls; got != calls {
		t.Errorf("oversized requests made %d lease calls, want 0", got-calls)
	}
}

func TestWaitBlocksUntilAllowed(t *testing.T) {
	r := startSemanticServer(t, `
rules:
  - name: fast
    key: [tenant]
    limit: 100
    period: 1s
    burst: 1
`, nil)
	a := newAgent(t, r, testConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := 0; i < 5; i++ {
		if d, err := a.Wait(ctx, ds("tenant", "acme"), 1); err != nil || !d.Allowed {
			t.Fatalf("Wait %d got %+v, %v", i, d, err)
		}
	}
	short, cancel2 := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel2()
	r2 := startSemanticServer(t, slowPolicy, nil)
	b := newAgent(t, r2, testConfig())
	for i := 0; i < 10; i++ {
		b.Allow(ctx, ds("tenant", "acme"), 1)
	}
	if _, err := b.Wait(short, ds("tenant", "acme"), 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait on an exhausted key got %v, want context.DeadlineExceeded", err)
	}
}

func TestIdleKeysAreReturnedAndEvicted(t *testing.T) {
	// Leases of 500ms leave the refresher ample time to see, before they
	// expire, that the key went quiet, even in a slow race-enabled run.
	r := startLeaseServerWith(t, `
rules:
  - name: pool
    key: [tenant]
    limit: 100000
    period: 1h
`, nil, service.Config{LeaseTTL: 500 * time.Millisecond})
	cfg := testConfig()
	cfg.LeasePeriod, cfg.LeaseTTL, cfg.IdleAfter = 100*time.Millisecond, 500*time.Millisecond, time.Second
	a := newAgent(t, r, cfg)
	ctx := context.Background()
	for i := 0; i < 500; i++ {
		a.Allow(ctx, ds("tenant", "idle"), 1)
	}
	if a.Stats().Keys != 1 {
		t.Fatalf("keys got %d, want 1", a.Stats().Keys)
	}
	eventually(t, 10*time.Second, "idle key evicted", func() bool { return a.Stats().Keys == 0 })
	s := a.Stats()
	if s.Evictions != 1 {
		t.Errorf("evictions got %d, want 1", s.Evictions)
	}
	if s.TokensReturned == 0 {
		t.Errorf("no tokens returned before the lease expired: %+v", s)
	}
	// The key comes back on demand.
	if d := a.Allow(ctx, ds("tenant", "idle"), 1); !d.Allowed {
		t.Errorf("evicted key denied: %+v", d)
	}
}

func TestMetricsRegistered(t *testing.T) {
	r := startSemanticServer(t, slowPolicy, nil)
	reg := prometheus.NewRegistry()
	cfg := testConfig()
	cfg.Registerer = reg
	a := newAgent(t, r, cfg)
	for i := 0; i < 12; i++ {
		a.Allow(context.Background(), ds("tenant", "acme"), 1)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case m.GetCounter() != nil:
				got[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[name] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				got[name] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	want := map[string]float64{
		"ration_agent_decisions_total,outcome=allowed,path=LEASE,rule=per-tenant": 10,
		"ration_agent_fallback_activations_total":                                 0,
		"ration_agent_keys":               1,
		"ration_agent_region_unreachable": 0,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s got %v, want %v", name, got[name], v)
		}
	}
	if got["ration_agent_round_trips_total,method=lease"] < 1 {
		t.Errorf("no lease round trips counted: %v", got)
	}
	if got["ration_agent_lease_tokens,rule=per-tenant"] < 1 {
		t.Errorf("no grant observed in ration_agent_lease_tokens: %v", got)
	}
	a.Close()
	// Close unregisters, so a new agent can use the same registry.
	b := newAgent(t, r, cfg)
	b.Close()
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no target", Config{}},
		{"negative period", Config{Target: "x", LeasePeriod: -1}},
		{"ttl below period", Config{Target: "x", LeasePeriod: time.Second, LeaseTTL: time.Millisecond}},
		{"bad headroom", Config{Target: "x", FallbackHeadroom: -1}},
		{"long id", Config{Target: "x", AgentID: string(make([]byte, 300))}},
	}
	for _, tt := range tests {
		if err := tt.cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: Validate got %v, want ErrInvalidConfig", tt.name, err)
		}
		if _, err := New(tt.cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New got %v, want ErrInvalidConfig", tt.name, err)
		}
	}
	if err := (Config{Target: "x"}).Validate(); err != nil {
		t.Errorf("Validate of a config with only a Target got %v, want nil (the defaults fill the rest)", err)
	}
}
