package agent

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ration-dev/ration/policy"
)

// benchPolicy is a limit no benchmark reaches, so that every decision is a
// leased spend (the path being measured) and never a denial.
const benchPolicy = `
rules:
  - name: bench
    key: [tenant]
    limit: 1000000000000000
    period: 1s
`

// benchWindowPolicy is benchPolicy's limit per calendar day, in a time zone
// with DST.
const benchWindowPolicy = `
rules:
  - name: bench
    key: [tenant]
    limit: 1000000000000000
    period: day
    algorithm: fixed_window
    time_zone: Europe/Berlin
`

// benchAgent starts a region and an agent for a benchmark and warms key
// until its leases cover the spend rate.
func benchAgent(b *testing.B, warm []policy.Descriptor) *Agent {
	b.Helper()
	return benchAgentWith(b, benchPolicy, warm)
}

// benchAgentWith is benchAgent serving the policy doc.
func benchAgentWith(b *testing.B, doc string, warm []policy.Descriptor) *Agent {
	b.Helper()
	r := startLeaseServer(b, doc, nil)
	// Generous deadlines: a slow round trip on a busy machine must not turn
	// into failure-mode decisions in a benchmark of the leased path.
	a := newAgent(b, r, Config{RoundTripTimeout: time.Second, RefreshTimeout: time.Second})
	ctx := context.Background()
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		for i := 0; i < 1000; i++ {
			a.Allow(ctx, warm, 1)
		}
	}
	return a
}

// BenchmarkAllowHotKey: one goroutine deciding requests on one leased key,
// beside x/time/rate's Limiter.Allow.
func BenchmarkAllowHotKey(b *testing.B) {
	d := ds("tenant", "acme")
	a := benchAgent(b, d)
	ctx := context.Background()
	b.Run("ration", func(b *testing.B) {
		b.ReportAllocs()
		denied := 0
		for b.Loop() {
			if !a.Allow(ctx, d, 1).Allowed {
				denied++
			}
		}
		if denied > 0 {
			b.Errorf("%d denied on a key far below its limit", denied)
		}
		st := a.Stats()
		b.Logf("N=%d lease calls %d sync %d p99 %v", b.N, st.LeaseCalls, st.SyncDecisions, st.RoundTripP99)
	})
	b.Run("baseline=x-time-rate", func(b *testing.B) {
		b.ReportAllocs()
		lim := rate.NewLimiter(1e15, math.MaxInt32)
		for b.Loop() {
			lim.Allow()
		}
	})
}

// BenchmarkAllowHotKeyFixedWindow: one goroutine deciding requests on one
// leased key of a daily fixed window in Europe/Berlin (each decision places
// itself in the window, from the rule's cached window), beside the same on
// a token bucket.
func BenchmarkAllowHotKeyFixedWindow(b *testing.B) {
	d := ds("tenant", "acme")
	for _, bb := range []struct{ name, doc string }{
		{"ration", benchWindowPolicy},
		{"baseline=token-bucket", benchPolicy},
	} {
		a := benchAgentWith(b, bb.doc, d)
		ctx := context.Background()
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !a.Allow(ctx, d, 1).Allowed {
					b.Fatal("denied on a key far below its limit")
				}
			}
		})
	}
}

// benchDryPolicy has a rule whose key runs dry at once and stays dry for
// the whole benchmark (one request an hour), beside benchPolicy's.
const benchDryPolicy = benchPolicy + `
  - name: dry
    key: [user]
    limit: 1
    period: 1h
`

// BenchmarkAllowDryKey: one goroutine deciding requests on a key whose
// region has nothing left, which the agent denies from its deny cache
// without a round trip, beside the same on a hot leased key.
func BenchmarkAllowDryKey(b *testing.B) {
	hot, dry := ds("tenant", "acme"), ds("user", "mallory")
	a := benchAgentWith(b, benchDryPolicy, hot)
	ctx := context.Background()
	for i := 0; i < 10 && a.Allow(ctx, dry, 1).Allowed; i++ { // its one token
	}
	b.Run("ration", func(b *testing.B) {
		b.ReportAllocs()
		before := a.Stats()
		for b.Loop() {
			if d := a.Allow(ctx, dry, 1); d.Allowed || d.Path != PathDenyCache {
				b.Fatalf("a dry key's decision: %+v, want a DENY_CACHE denial", d)
			}
		}
		if st := a.Stats(); st.SyncDecisions != before.SyncDecisions {
			b.Errorf("%d decisions on a dry key waited for a round trip", st.SyncDecisions-before.SyncDecisions)
		}
	})
	b.Run("baseline=hot-leased-key", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !a.Allow(ctx, hot, 1).Allowed {
				b.Fatal("denied on a key far below its limit")
			}
		}
	})
}

// BenchmarkWindowCache: placing an instant in a daily window of
// Europe/Berlin from the rule's cache, beside policy.Rule.Window, which
// walks the time zone.
func BenchmarkWindowCache(b *testing.B) {
	r := mustPolicy(b, benchWindowPolicy).Rule("bench")
	wall := time.Date(2026, 10, 25, 12, 0, 0, 0, time.UTC).UnixNano()
	var wc windowCache
	b.Run("ration", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			wc.at(r, wall)
		}
	})
	b.Run("baseline=Rule.Window", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r.Window(time.Unix(0, wall))
		}
	})
}

// BenchmarkAllowHotKeyParallel: every core deciding requests on the same
// leased key, beside x/time/rate, whose Limiter takes a mutex.
func BenchmarkAllowHotKeyParallel(b *testing.B) {
	d := ds("tenant", "acme")
	a := benchAgent(b, d)
	b.Run("ration", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				a.Allow(ctx, d, 1)
			}
		})
	})
	b.Run("baseline=x-time-rate", func(b *testing.B) {
		b.ReportAllocs()
		lim := rate.NewLimiter(1e15, math.MaxInt32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.Allow()
			}
		})
	})
}

// BenchmarkAllowManyKeys: decisions spread over 1M distinct leased keys
// (the map lookup and a cache miss per key dominate), beside a sync.Map of
// x/time/rate Limiters. The leases are installed directly: fetching a
// million of them one request at a time would measure the network, not
// Allow.
func BenchmarkAllowManyKeys(b *testing.B) {
	const n = 1 << 20
	descs := make([][]policy.Descriptor, n)
	names := make([]string, n)
	for i := range descs {
		names[i] = fmt.Sprintf("t%07d", i)
		descs[i] = ds("tenant", names[i])
	}
	a := benchAgent(b, descs[0])
	rule := a.Policy().Rule("bench")
	now := a.now()
	far := now + int64(time.Hour)
	var buf []byte
	for i := range descs {
		buf = append(append(append(buf[:0], rule.Name...), 0), "tenant="+names[i]...)
		k := a.c.keys.getOrCreate(buf, func(id []byte) *keyState { return newKeyState(id, len(rule.Name), now) })
		k.slots.install(now, far, 1<<40)
	}
	b.Run("ration", func(b *testing.B) {
		b.ReportAllocs()
		ctx := context.Background()
		i := 0
		for b.Loop() {
			if !a.Allow(ctx, descs[i&(n-1)], 1).Allowed {
				b.Fatal("denied")
			}
			i++
		}
	})
	b.Run("baseline=x-time-rate-syncmap", func(b *testing.B) {
		b.ReportAllocs()
		var m sync.Map
		for _, name := range names {
			m.Store(name, rate.NewLimiter(1e15, math.MaxInt32))
		}
		i := 0
		b.ResetTimer()
		for b.Loop() {
			l, _ := m.Load(names[i&(n-1)])
			l.(*rate.Limiter).Allow()
			i++
		}
	})
}

func TestAllowIsAllocationFree(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	for _, tt := range []struct{ name, doc string }{{"token bucket", benchPolicy}, {"fixed window", benchWindowPolicy}} {
		t.Run(tt.name, func(t *testing.T) { testAllowIsAllocationFree(t, tt.doc) })
	}
}

func testAllowIsAllocationFree(t *testing.T, doc string) {
	r := startLeaseServer(t, doc, nil)
	a := newAgent(t, r, Config{})
	d := ds("tenant", "acme")
	ctx := context.Background()
	for i := 0; i < 1000; i++ {
		a.Allow(ctx, d, 1)
	}
	// Install a lease that outlasts the measurement, so that no refresh or
	// round trip is part of it.
	k := a.c.keys.get([]byte("bench\x00tenant=acme"))
	eventually(t, 5*time.Second, "no round trip in flight", func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.flight != nil {
			return false
		}
		k.slots.install(a.now(), a.now()+int64(time.Hour), 1<<40)
		k.lowWater.Store(0)
		k.flags.set(flagQueued, true) // as if a refresh were queued: none will be
		return true
	})
	if allocs := testing.AllocsPerRun(10000, func() { a.Allow(ctx, d, 1) }); allocs != 0 {
		t.Errorf("Allow on a leased key allocates %v times, want 0", allocs)
	}
}
