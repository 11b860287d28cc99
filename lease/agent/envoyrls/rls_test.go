package envoyrls

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// overridePolicy limits each user to 10 a minute and lets an Envoy limit
// override of 2 a minute select a rule of its own; 5 a minute matches the
// override's value but does not allow descriptor limits.
const overridePolicy = `
rules:
  - {name: per-user, key: [user], limit: 10, period: 1m, algorithm: fixed_window}
  - {name: user-override-2m, match: {envoy.limit: 2/minute}, key: [user], limit: 2, period: 1m, algorithm: fixed_window, allow_descriptor_limit: true}
  - {name: user-override-5m, match: {envoy.limit: 5/minute}, key: [user], limit: 5, period: 1m, algorithm: fixed_window}
`

func withLimit(d *ratelimitv3.RateLimitDescriptor, n uint32, unit typev3.RateLimitUnit) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
	return d
}

// TestLimitOverride: an override the policy allows selects its rule, which
// decides with the request's other rules; an override no rule allows (or
// whose rule's quota differs) is ignored and counted, and the request is
// decided by its other rules alone; an override can never lift a limit.
func TestLimitOverride(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newServer(t, overridePolicy, Config{Registerer: reg})
	ctx := context.Background()
	send := func(d *ratelimitv3.RateLimitDescriptor, n int) (ok int, rule string) {
		t.Helper()
		for range n {
			resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds(d)})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok++
			}
			rule = resp.GetStatuses()[0].GetCurrentLimit().GetName()
		}
		return ok, rule
	}
	if ok, rule := send(withLimit(desc("user=a"), 2, typev3.RateLimitUnit_MINUTE), 4); ok != 2 || rule != "user-override-2m" {
		t.Errorf("allowed override 2/minute: %d of 4 admitted, denied by %q; want 2, user-override-2m", ok, rule)
	}
	// Not allowed (no allow_descriptor_limit), or no rule with that quota:
	// decided by per-user alone, whose 10 are spent by nobody else yet.
	if ok, rule := send(withLimit(desc("user=b"), 5, typev3.RateLimitUnit_MINUTE), 7); ok != 7 || rule != "per-user" {
		t.Errorf("override 5/minute without allow_descriptor_limit: %d of 7 admitted by %q; want 7, per-user", ok, rule)
	}
	if ok, _ := send(withLimit(desc("user=c"), 2, typev3.RateLimitUnit_SECOND), 3); ok != 3 {
		t.Errorf("override 2/second, which no rule has: %d of 3 admitted; want 3", ok)
	}
	// A large override cannot lift per-user's 10.
	if ok, rule := send(withLimit(desc("user=d"), 1000, typev3.RateLimitUnit_MINUTE), 12); ok != 10 || rule != "per-user" {
		t.Errorf("override 1000/minute: %d of 12 admitted, denied by %q; want 10, per-user", ok, rule)
	}
	honoured := testutil.ToFloat64(s.m.overrides.WithLabelValues("honoured"))
	ignored := testutil.ToFloat64(s.m.overrides.WithLabelValues("ignored"))
	if honoured != 4 || ignored != 22 {
		t.Errorf("overrides counted honoured %v, ignored %v; want 4, 22", honoured, ignored)
	}
}

// TestResponseHeaders: the response carries the tightest decision's
// rate-limit fields, as the HTTP middleware writes them, and Retry-After
// when denied; shadow decisions and OmitHeaders add none.
func TestResponseHeaders(t *testing.T) {
	const doc = `
rules:
  - {name: per-user, key: [user], limit: 3, period: 1m, algorithm: fixed_window}
  - {name: per-route, key: [route], limit: 100, period: 1m, algorithm: fixed_window}
  - {name: trial, key: [trial], limit: 1, period: 1m, algorithm: fixed_window, shadow: true}
`
	s := newServer(t, doc, Config{})
	ctx := context.Background()
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds(desc("route=/x"), desc("user=u"))}
	hv := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, Value: v} }
	resp, err := s.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// per-user has 2 of 3 left, per-route 99 of 100: per-user is tightest.
	// 10:00:00.2 leaves 59.8s of the minute, 60 in whole seconds.
	want := []*corev3.HeaderValue{
		hv("Ratelimit", `"per-user";r=2;t=60`), hv("Ratelimit-Policy", `"per-user";q=3;w=60`),
		hv("X-Ratelimit-Limit", "3"), hv("X-Ratelimit-Remaining", "2"), hv("X-Ratelimit-Reset", "60"),
	}
	if d := cmp.Diff(want, resp.GetResponseHeadersToAdd(), protocmp.Transform()); d != "" {
		t.Errorf("headers (-want +got):\n%s", d)
	}
	for range 2 {
		if resp, err = s.ShouldRateLimit(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err = s.ShouldRateLimit(ctx, req); err != nil {
		t.Fatal(err)
	}
	want = []*corev3.HeaderValue{
		hv("Ratelimit", `"per-user";r=0;t=60`), hv("Ratelimit-Policy", `"per-user";q=3;w=60`), hv("Retry-After", "60"),
		hv("X-Ratelimit-Limit", "3"), hv("X-Ratelimit-Remaining", "0"), hv("X-Ratelimit-Reset", "60"),
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("4th request: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	if d := cmp.Diff(want, resp.GetResponseHeadersToAdd(), protocmp.Transform()); d != "" {
		t.Errorf("denied headers (-want +got):\n%s", d)
	}

	// Shadow: OK, the status describes the shadow rule, no headers.
	shadow := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds(desc("trial=t"))}
	for i := range 3 {
		if resp, err = s.ShouldRateLimit(ctx, shadow); err != nil {
			t.Fatal(err)
		}
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("shadow request %d: overall %v, status %v; want OK", i, resp.GetOverallCode(), st)
		}
		// Past its limit, the status names the shadow rule that would deny.
		if i > 0 && st.GetCurrentLimit().GetName() != "trial" {
			t.Errorf("shadow request %d: status %v, want the limit of trial", i, st)
		}
		if len(resp.GetResponseHeadersToAdd()) != 0 {
			t.Errorf("shadow request %d: headers %v, want none", i, resp.GetResponseHeadersToAdd())
		}
	}
	if got := testutil.ToFloat64(s.m.shadow); got != 2 {
		t.Errorf("shadow descriptors counted %v, want 2", got)
	}

	quiet := newServer(t, doc, Config{OmitHeaders: true})
	if resp, err = quiet.ShouldRateLimit(ctx, req); err != nil || len(resp.GetResponseHeadersToAdd()) != 0 {
		t.Errorf("OmitHeaders: got %v, %v; want no headers", resp.GetResponseHeadersToAdd(), err)
	}
}

// TestBadDescriptorSpendsNothing: a request with a bad descriptor is
// refused before any of its descriptors is decided.
func TestBadDescriptorSpendsNothing(t *testing.T) {
	s := newServer(t, "rules:\n  - {name: per-user, key: [user], limit: 1, period: 1m, algorithm: fixed_window}\n", Config{})
	ctx := context.Background()
	bad := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds(desc("user=u"), desc())}
	if _, err := s.ShouldRateLimit(ctx, bad); err == nil {
		t.Fatal("a descriptor without entries: got no error")
	}
	resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds(desc("user=u"))})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("after the refused request: %v, %v; want OK (its token unspent)", resp.GetOverallCode(), err)
	}
}

func TestLimitValue(t *testing.T) {
	type o = ratelimitv3.RateLimitDescriptor_RateLimitOverride
	for _, tt := range []struct {
		l      *o
		want   string
		period time.Duration
		ok     bool
	}{
		{&o{RequestsPerUnit: 100, Unit: typev3.RateLimitUnit_MINUTE}, "100/minute", time.Minute, true},
		{&o{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(1)}, "7/second", time.Second, true},
		{&o{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(30)}, "7/30second", 30 * time.Second, true},
		{&o{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_DAY}, "1/day", 24 * time.Hour, true},
		{&o{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR}, "", 0, false},
		{&o{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_UNKNOWN}, "", 0, false},
		{&o{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(0)}, "", 0, false},
	} {
		v, p, ok := LimitValue(tt.l)
		if v != tt.want || p != tt.period || ok != tt.ok {
			t.Errorf("%v: got %q, %v, %v; want %q, %v, %v", tt.l, v, p, ok, tt.want, tt.period, tt.ok)
		}
	}
}
