package sim

import (
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/policy"
)

// TestParsePeriod: a key group's limit is per period, and its keys' rules
// run at limit ÷ period tokens per second.
func TestParsePeriod(t *testing.T) {
	sc := parseDoc(t, "s.yaml", strings.Replace(goodHead, "limit: 10 }", "limit: 100, period: 1m, algorithm: token_bucket }", 1))
	g := sc.Keys[0]
	if g.Period != time.Minute || g.RuleAlgorithm != TokenBucket || g.Burst != 100 {
		t.Fatalf("got period %v, algorithm %q, burst %d; want 1m, token_bucket, 100 (the limit)", g.Period, g.RuleAlgorithm, g.Burst)
	}
	w, err := newWorld(sc, Escrow)
	if err != nil {
		t.Fatal(err)
	}
	k := w.keys[0]
	if k.rule.Period != time.Minute || k.rule.Limit != 100 || math.Abs(k.rate-100.0/60) > 1e-12 || k.burst != 100 {
		t.Errorf("got rule period %v, limit %d, rate %v, burst %v; want 1m, 100, 1.667 tokens/s, 100", k.rule.Period, k.rule.Limit, k.rate, k.burst)
	}
	// The policy's longest period makes a valid rule too.
	longest := parseDoc(t, "s.yaml", strings.Replace(goodHead, "limit: 10 }", "limit: 10, period: "+policy.MaxPeriod.String()+" }", 1))
	if w, err := newWorld(longest, Escrow); err != nil || w.keys[0].rule.Period != policy.MaxPeriod {
		t.Errorf("period %v: got %v, want a rule of that period", policy.MaxPeriod, err)
	}
}

func TestParsePeriodErrors(t *testing.T) {
	key := func(fields string) string {
		return strings.Replace(goodHead, "limit: 10 }", "limit: 10, "+fields+" }", 1)
	}
	// The policy's longest period, which the simulator follows.
	most, tooLong := policy.MaxPeriod.String(), (policy.MaxPeriod + time.Hour).String()
	tests := []struct {
		name, doc, want string
	}{
		{"zero period", key("period: 0s"), "s.yaml:5: keys[0].period: must be > 0 and at most " + most + " (got 0s)"},
		{"period too long", key("period: " + tooLong), "s.yaml:5: keys[0].period: must be > 0 and at most " + most + " (got " + tooLong + ")"},
		{"negative period", key("period: -1m"), "s.yaml:5: keys[0].period: must not be negative"},
		{"period not a duration", key("period: 60"), `s.yaml:5: keys[0].period: must be a Go duration such as "1s" or "500ms" (got integer 60)`},
		{"fixed window", key("algorithm: fixed_window"), "s.yaml:5: keys[0].algorithm: fixed_window is not supported yet (only token_bucket"},
		{"unknown algorithm", key("algorithm: sliding_log"), `s.yaml:5: keys[0].algorithm: must be one of "token_bucket", "fixed_window" (got`},
		{"algorithm not a string", key("algorithm: 3"), `s.yaml:5: keys[0].algorithm: must be one of "token_bucket", "fixed_window" (got integer 3)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := Parse("s.yaml", []byte(tc.doc))
			if err == nil {
				t.Fatalf("got scenario %+v, want error %q", sc, tc.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("got error %v, want one wrapping ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error\n%v\nwant it to contain\n%s", err, tc.want)
			}
		})
	}
}

// TestPendingScenarios keeps the scenarios that wait for fixed windows
// valid but for that: each is refused only for its algorithm. When fixed
// windows exist, they move to ../scenarios/ and this test goes.
func TestPendingScenarios(t *testing.T) {
	files, err := filepath.Glob("../scenarios/pending/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("found %d pending scenarios (%v), want some", len(files), err)
	}
	for _, f := range files {
		_, err := LoadFile(f)
		var es Errors
		if !errors.As(err, &es) {
			t.Errorf("%s: got %v, want the fixed_window error", f, err)
			continue
		}
		for _, e := range es {
			if !strings.HasSuffix(e.Field, ".algorithm") || !strings.Contains(e.Msg, "not supported yet") {
				t.Errorf("%s: got %v, want only the fixed_window error", f, e)
			}
		}
	}
}

// TestVersusIdealMatchesTheStore: in the ideal algorithm's run, the ideal
// buckets every run asks admit exactly what its one lease.MemoryStore
// does, request by request, so that admitted_vs_ideal_pct compares like
// with like.
func TestVersusIdealMatchesTheStore(t *testing.T) {
	for _, f := range []string{"testdata/golden.yaml", "../scenarios/minute-bucket-moving.yaml", "../scenarios/ten-minute-quota.yaml"} {
		res, err := Run(load(t, f), Options{Algorithm: Ideal})
		if err != nil {
			t.Fatal(err)
		}
		s := res.Summary
		if s.IdealAdmitted != s.Admitted || s.IdealAdmitted == 0 {
			t.Errorf("%s: ideal_admitted %d, admitted %d; want them equal and > 0", f, s.IdealAdmitted, s.Admitted)
		}
		for i, st := range s.Steps {
			if st.IdealAdmitted != st.Admitted {
				t.Errorf("%s: steps[%d]: ideal_admitted %d, admitted %d; want them equal", f, i, st.IdealAdmitted, st.Admitted)
			}
		}
	}
}

// longPeriodScenarios are the committed scenarios of quotas with a long
// period (issue 11).
var longPeriodScenarios = []string{"../scenarios/minute-bucket-moving.yaml", "../scenarios/ten-minute-quota.yaml"}

// TestLongPeriodBound: escrow keeps the bound for quotas with long
// periods, as for every other scenario.
func TestLongPeriodBound(t *testing.T) {
	for _, f := range longPeriodScenarios {
		res, err := Run(load(t, f), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if s := res.Summary; s.BoundRatioMax > 1 || s.WindowsOverBound > 0 {
			t.Errorf("%s: bound_ratio_max %v, %d windows over the bound; want ≤ 1, 0", f, s.BoundRatioMax, s.WindowsOverBound)
		}
	}
}

// TestLongPeriodTargets is issue 11's target for quotas whose tokens are
// almost all balance: escrow admits ≥ 97% of what one ideal bucket fed the
// same requests admits, over the run and in every demand step (the first
// 10 s of ten-minute-quota, the end-to-end window: ≥ 95%), and its shares
// converge within 3 s of every step.
func TestLongPeriodTargets(t *testing.T) {
	t.Skip("needs token escrow (issue 11)")
	for _, f := range longPeriodScenarios {
		res, err := Run(load(t, f), Options{})
		if err != nil {
			t.Fatal(err)
		}
		s := res.Summary
		if s.VersusIdealPct == nil || *s.VersusIdealPct < 97 {
			t.Errorf("%s: admitted_vs_ideal_pct %v, want ≥ 97", f, optPct(s.VersusIdealPct))
		}
		for i, st := range s.Steps {
			want := 97.0
			if strings.HasSuffix(f, "ten-minute-quota.yaml") && i == 0 {
				want = 95
			}
			if st.VersusIdealPct == nil || *st.VersusIdealPct < want {
				t.Errorf("%s: steps[%d] (at %vs): admitted_vs_ideal_pct %v, want ≥ %v", f, i, st.AtS, optPct(st.VersusIdealPct), want)
			}
			if st.ConvergenceS == nil || *st.ConvergenceS > 3 || st.Unconverged {
				t.Errorf("%s: steps[%d] (at %vs): convergence %v (unconverged %v), want ≤ 3 s", f, i, st.AtS, optSec(st.ConvergenceS, 0), st.Unconverged)
			}
		}
	}
}
