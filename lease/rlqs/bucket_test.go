package rlqs

import (
	"errors"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/envoydesc"
)

const testPolicy = `rules:
  - name: trial
    match: { domain: edge, plan: free }
    key: [tenant]
    limit: 10
    shadow: true
  - name: edge-tenant
    match: { domain: edge }
    key: [tenant, route]
    limit: 100
    period: 1s
  - name: daily
    match: { domain: daily }
    key: [tenant]
    algorithm: fixed_window
    limit: 1000
    period: 1h
`

func mustPolicy(t testing.TB, y string) *policy.Set {
	t.Helper()
	p, err := policy.Parse("test", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBucketKeyIgnoresOrderAndDoesNotCollide(t *testing.T) {
	a := bucketKey(map[string]string{"tenant": "acme", "route": "/v1"})
	b := bucketKey(map[string]string{"route": "/v1", "tenant": "acme"})
	if a != b {
		t.Fatalf("the same pairs gave two keys: %q, %q", a, b)
	}
	// Pairs whose concatenations agree must still differ.
	pairs := []map[string]string{
		{"ab": "c"}, {"a": "bc"}, {"a": "b", "c": ""}, {"a": "b=c"}, {"a=b": "c"}, {"a": "", "bc": ""},
	}
	seen := map[string]int{}
	for i, m := range pairs {
		k := bucketKey(m)
		if j, ok := seen[k]; ok {
			t.Errorf("%v and %v share the key %q", pairs[j], m, k)
		}
		seen[k] = i
	}
}

// TestResolveMapsLikeRLS checks that a bucket resolves to the rule and key
// Envoy's RLS adapter would give a descriptor with the same entries, in any
// order: the domain under "domain", shadow rules skipped, and a bucket no
// rule applies to unlimited.
func TestResolveMapsLikeRLS(t *testing.T) {
	pol := mustPolicy(t, testPolicy)
	bucket := map[string]string{"route": "/v1/x", "tenant": "acme", "plan": "free"}
	r, key, err := Resolve(pol, "", "edge", bucket)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "edge-tenant" || key != "tenant=acme,route=/v1/x" {
		t.Fatalf("got %s %q, want edge-tenant %q", r.Name, key, "tenant=acme,route=/v1/x")
	}
	// RLS: the same entries in another order, through the mapping envoyrls uses.
	ds, err := envoydesc.Append(nil, "", "edge", []*ratelimitv3.RateLimitDescriptor_Entry{
		{Key: "tenant", Value: "acme"}, {Key: "plan", Value: "free"}, {Key: "route", Value: "/v1/x"}})
	if err != nil {
		t.Fatal(err)
	}
	var rls *policy.Rule
	for _, m := range pol.Match(nil, ds) {
		if !m.Shadow {
			rls = m
			break
		}
	}
	if rls != r || string(rls.AppendKey(nil, ds)) != key {
		t.Fatalf("RLS maps to %v %q, RLQS to %v %q", rls, rls.AppendKey(nil, ds), r, key)
	}

	if _, _, err := Resolve(pol, "", "unknown", bucket); !errors.Is(err, ErrNoRule) {
		t.Errorf("unknown domain: got %v, want ErrNoRule", err)
	}
	if _, _, err := Resolve(pol, "-", "edge", bucket); !errors.Is(err, ErrNoRule) {
		t.Errorf("domain not passed (-): got %v, want ErrNoRule", err)
	}
	if _, _, err := Resolve(pol, "", "daily", map[string]string{"tenant": "acme"}); !errors.Is(err, errFixed) {
		t.Errorf("fixed window: got %v, want errFixed", err)
	}
	if _, _, err := Resolve(pol, "", "edge", map[string]string{"": "x"}); err == nil || errors.Is(err, ErrNoRule) {
		t.Errorf("empty key: got %v, want an error", err)
	}
}

func TestDecodeUsage(t *testing.T) {
	lim := limits{entries: 2, entryLen: 8, requests: 1000}
	u := func(m map[string]string, el *durationpb.Duration, a, d uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
		return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: m},
			TimeElapsed: el, NumRequestsAllowed: a, NumRequestsDenied: d}
	}
	ok := map[string]string{"tenant": "acme"}
	for _, tc := range []struct {
		name string
		in   *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
		bad  string
	}{
		{"ok", u(ok, durationpb.New(5e9), 10, 2), ""},
		{"no time_elapsed", u(ok, nil, 1, 0), ""},
		{"zero time_elapsed", u(ok, durationpb.New(0), 1, 0), ""},
		{"no bucket id", &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{}, badEmptyID},
		{"empty bucket id", u(map[string]string{}, nil, 1, 0), badEmptyID},
		{"too many pairs", u(map[string]string{"a": "", "b": "", "c": ""}, nil, 1, 0), badEntries},
		{"empty key", u(map[string]string{"": "x"}, nil, 1, 0), badEntry},
		{"long value", u(map[string]string{"a": strings.Repeat("x", 9)}, nil, 1, 0), badEntry},
		{"negative time_elapsed", u(ok, &durationpb.Duration{Seconds: -1}, 1, 0), badElapsed},
		{"invalid time_elapsed", u(ok, &durationpb.Duration{Seconds: 1, Nanos: -5}, 1, 0), badElapsed},
		{"huge count", u(ok, nil, 1<<63, 0), badCount},
		{"sum over the bound", u(ok, nil, 600, 600), badCount},
		{"overflowing sum", u(ok, nil, 1<<63, 1<<63), badCount},
	} {
		got, bad := decodeUsage(tc.in, lim)
		if bad != tc.bad {
			t.Errorf("%s: got %q, want %q", tc.name, bad, tc.bad)
			continue
		}
		if bad == "" && (got.allowed < 0 || got.denied < 0 || got.elapsed < 0 || got.id != bucketKey(tc.in.GetBucketId().GetBucket())) {
			t.Errorf("%s: decoded %+v", tc.name, got)
		}
	}
}

// FuzzDecodeUsage decodes arbitrary bytes as a usage: never a panic, and
// a usage accepted is within its limits and keyed by its pairs.
func FuzzDecodeUsage(f *testing.F) {
	seed, _ := proto.Marshal(&rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}, TimeElapsed: durationpb.New(5e9),
		NumRequestsAllowed: 7, NumRequestsDenied: 3})
	f.Add(seed)
	f.Add([]byte{})
	lim := limits{entries: 4, entryLen: 16, requests: 1 << 20}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		u, bad := decodeUsage(&m, lim)
		if bad != "" {
			return
		}
		bucket := m.GetBucketId().GetBucket()
		switch {
		case len(bucket) == 0 || len(bucket) > lim.entries:
			t.Fatalf("accepted %d pairs", len(bucket))
		case u.allowed < 0 || u.denied < 0 || uint64(u.allowed+u.denied) > lim.requests:
			t.Fatalf("accepted counts %d, %d", u.allowed, u.denied)
		case u.elapsed < 0:
			t.Fatalf("accepted time_elapsed %v", u.elapsed)
		case u.id != bucketKey(bucket):
			t.Fatalf("key %q, want %q", u.id, bucketKey(bucket))
		}
	})
}
