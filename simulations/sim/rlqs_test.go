package sim

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/lease/rlqs"
	"github.com/ration-dev/ration/policy"
)

func TestParseRLQS(t *testing.T) {
	sc := parseDoc(t, "s.yaml", goodHead+"rlqs: { proxies_per_region: 2, proxies: { eu: 0 }, report_interval: 5s, fallback: { token_bucket: { max_tokens: 3, tokens_per_fill: 4, fill_interval: 2s } } }\n"+
		"faults:\n  - { at: 1s, disconnect_proxies: 1, region: us, for: 2s }\n  - { at: 2s, crash_proxies: 2, region: us }\n")
	want := &RLQS{Proxies: map[string]int{"us": 2, "eu": 0}, ReportInterval: 5 * time.Second,
		Fallback: ProxyFallback{Kind: FallbackTokenBucket, MaxTokens: 3, TokensPerFill: 4, FillInterval: 2 * time.Second}}
	if diff := cmp.Diff(want, sc.RLQS); diff != "" {
		t.Errorf("rlqs (-want +got):\n%s", diff)
	}
	if f := sc.Faults; len(f) != 2 || f[0].Kind != "disconnect_proxies" || f[0].Proxies != 1 || f[0].For != 2*time.Second || f[1].Kind != "crash_proxies" || f[1].Proxies != 2 {
		t.Errorf("got faults %+v, want a disconnect of 1 proxy for 2s and a crash of 2", f)
	}
	sc = parseDoc(t, "s.yaml", goodHead+"rlqs: { proxies: { us: 1 } }\n")
	if want := (&RLQS{Proxies: map[string]int{"us": 1, "eu": 0}, ReportInterval: time.Second, Fallback: ProxyFallback{Kind: FallbackDenyAll}}); !cmp.Equal(want, sc.RLQS) {
		t.Errorf("defaults: got %+v, want %+v", sc.RLQS, want)
	}
}

func TestParseRLQSErrors(t *testing.T) {
	tests := []struct{ name, doc, want string }{
		{"unknown field", "rlqs: { proxies_per_region: 1, ttl: 2s }\n", "s.yaml:8: rlqs.ttl: unknown field"},
		{"unknown region", "rlqs: { proxies: { mars: 1 } }\n", "s.yaml:8: rlqs.proxies.mars: unknown field (known: eu, us)"},
		{"no proxies", "rlqs: { report_interval: 1s }\n", "s.yaml:8: rlqs: no region has proxies"},
		{"fractional interval", "rlqs: { proxies_per_region: 1, report_interval: 1500ms }\n", "s.yaml:8: rlqs.report_interval: must be whole seconds, at least 1s"},
		{"bad fallback", "rlqs: { proxies_per_region: 1, fallback: reuse_last }\n", `s.yaml:8: rlqs.fallback: must be one of "deny_all", "allow_all"`},
		{"fallback field", "rlqs:\n  proxies_per_region: 1\n  fallback: { token_bucket: { max_tokens: 1, tokens_per_fill: 1, burst: 2 } }\n", "s.yaml:10: rlqs.fallback.token_bucket.burst: unknown field"},
		{"fallback needs tokens", "rlqs:\n  proxies_per_region: 1\n  fallback: { token_bucket: { max_tokens: 1 } }\n", "s.yaml:10: rlqs.fallback.token_bucket.tokens_per_fill: is required"},
		{"fallback fill", "rlqs:\n  proxies_per_region: 1\n  fallback: { token_bucket: { max_tokens: 1, tokens_per_fill: 1, fill_interval: 100ms } }\n", "s.yaml:10: rlqs.fallback.token_bucket.fill_interval: must be whole seconds"},
		{"negative proxies", "rlqs: { proxies_per_region: -1 }\n", "s.yaml:8: rlqs.proxies_per_region: must be in [0, 10000]"},
		{"proxy fault without proxies", "faults:\n  - { at: 1s, crash_proxies: 1, region: us }\n", "s.yaml:9: faults[0].crash_proxies: region us has no RLQS proxies"},
		{"proxy fault in a region without", "rlqs: { proxies: { eu: 1 } }\nfaults:\n  - { at: 1s, disconnect_proxies: 1, region: us, for: 1s }\n", "s.yaml:10: faults[0].disconnect_proxies: region us has no RLQS proxies"},
		{"disconnect needs for", "rlqs: { proxies: { us: 1 } }\nfaults:\n  - { at: 1s, disconnect_proxies: 1, region: us }\n", "s.yaml:10: faults[0].for: is required for disconnect_proxies"},
		{"crash needs region", "rlqs: { proxies: { us: 1 } }\nfaults:\n  - { at: 1s, crash_proxies: 1 }\n", "s.yaml:10: faults[0].region: is required for crash_proxies"},
		{"crash count", "rlqs: { proxies: { us: 1 } }\nfaults:\n  - { at: 1s, crash_proxies: 0.5, region: us }\n", "s.yaml:10: faults[0].crash_proxies: must be an integer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { wantParseError(t, goodHead+tc.doc, tc.want) })
	}
}

// TestProxiesLeaseTheAgentsKeys: a proxy's bucket id, under the proxies'
// domain, resolves to the rule and store key the agents lease, so proxies
// and agents of a key draw on one regional bucket.
func TestProxiesLeaseTheAgentsKeys(t *testing.T) {
	sc := load(t, "testdata/rlqs.yaml")
	w, err := newWorld(sc, Escrow)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range w.keys {
		id := map[string]string{k.ds[0].Key: k.ds[0].Value, k.ds[1].Key: k.ds[1].Value}
		r, key, err := rlqs.Resolve(w.set, rlqs.Config{}.WithDefaults().DomainKey, simDomain, id)
		if err != nil {
			t.Fatal(err)
		}
		if got := policy.StoreKey(r.Name, key); got != k.storeKey {
			t.Errorf("bucket %v: got store key %q, want the agents' %q", id, got, k.storeKey)
		}
	}
}

// TestGoldenRLQS is TestGolden for proxies: the same scenario and seed give
// byte-identical outputs, another seed others, and no window exceeds the
// RLQS bound.
func TestGoldenRLQS(t *testing.T) {
	sc := load(t, "testdata/rlqs.yaml")
	for _, alg := range []Algorithm{Escrow, Static} {
		t.Run(string(alg), func(t *testing.T) {
			s1, c1, res := outputs(t, sc, Options{Algorithm: alg})
			s2, c2, _ := outputs(t, sc, Options{Algorithm: alg})
			if diff := cmp.Diff(string(s1), string(s2)); diff != "" {
				t.Errorf("summary.json of two runs with seed %d differs (-first +second):\n%s", sc.Seed, diff)
			}
			if !bytes.Equal(c1, c2) {
				t.Errorf("series.csv of two runs with seed %d differs", sc.Seed)
			}
			s := res.Summary
			if s.BoundBroken() {
				t.Errorf("bound_ratio_max %v, %d windows over: want ≤ 1, none", s.BoundRatioMax, s.WindowsOverBound)
			}
			if s.Paths["rlqs_token_bucket_allowed"] == 0 || s.Paths["rlqs_fallback_allowed"] == 0 {
				t.Errorf("paths %v: want decisions by assigned token buckets and by the fallback", s.Paths)
			}
			if s.Proxies != 5 || s.Agents != 2 {
				t.Errorf("got %d proxies and %d agents, want 5 and 2 (ap's)", s.Proxies, s.Agents)
			}
			other := *sc
			other.Seed++
			s3, _, _ := outputs(t, &other, Options{Algorithm: alg})
			if bytes.Equal(s1, s3) {
				t.Errorf("seeds %d and %d gave the same summary", sc.Seed, other.Seed)
			}
		})
	}
}

// TestDisconnectedProxysPartMoves: when one of a region's three proxies
// loses its stream, its assignment runs out with its TTL, and the region's
// refill goes to the other two (the Fair no longer counts its demand), so
// their token buckets grow to about the region's rate between them.
func TestDisconnectedProxysPartMoves(t *testing.T) {
	doc := `name: rlqs-disconnect
duration: 45s
regions: [eu, us]
rlqs: { proxies: { eu: 3 } }
keys:
  - { name: edge, limit: 300 }
demand:
  - { at: 0s, rates: { eu: 900 } }
faults:
  - { at: 30s, disconnect_proxies: 1, region: eu, for: 14s }
`
	perFill := func(end time.Duration) (connected, cut []int64, expires []int64) {
		sc := parseDoc(t, "d.yaml", doc)
		sc.Duration = end
		w, err := newWorld(sc, Escrow)
		if err != nil {
			t.Fatal(err)
		}
		w.loop(nil)
		if w.firstErr != nil {
			t.Fatal(w.firstErr)
		}
		for _, p := range w.rs[0].px.live {
			b := p.buckets[0]
			if b == nil || b.tb == nil {
				t.Fatalf("at %v proxy %s holds no token bucket", end, p.name)
			}
			if p.stream == nil {
				cut = append(cut, int64(b.tb.GetTokensPerFill().GetValue()))
				expires = append(expires, b.expires)
				continue
			}
			connected = append(connected, int64(b.tb.GetTokensPerFill().GetValue()))
		}
		return connected, cut, expires
	}
	before, _, _ := perFill(29 * time.Second)
	after, cut, expires := perFill(40 * time.Second)
	t.Logf("tokens per fill: before %v, after %v (cut: %v)", before, after, cut)
	if len(before) != 3 || len(after) != 2 || len(cut) != 1 {
		t.Fatalf("got %d proxies connected before and %d after, %d cut; want 3, 2, 1", len(before), len(after), len(cut))
	}
	if want := int64(32 * time.Second); expires[0] > want {
		t.Errorf("the cut proxy's assignment expires at %v, want by %v (its TTL after the cut)", dur(expires[0]), dur(want))
	}
	var sumBefore, sumAfter int64
	for _, x := range before {
		sumBefore += x
	}
	for _, x := range after {
		sumAfter += x
	}
	if sumAfter*10 < sumBefore*8 {
		t.Errorf("the two connected proxies' tokens per fill sum to %d, want at least 80%% of the three's before (%d)", sumAfter, sumBefore)
	}
}
