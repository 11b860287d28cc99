package lease

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// The cases in this file depend on the store's clock. A MemoryStore's
// clock is the harness's fake one; Redis reads its own (TIME), so these
// cases measure elapsed time around the calls and check bounds that hold
// whatever the exact timing: nothing is granted beyond
// capacity + rate × elapsed, and refill is never faster than the rate.

// pollDeadline bounds every wait for a condition.
const pollDeadline = 5 * time.Second

// poll calls h.tick until cond holds, failing the test after pollDeadline.
func poll(t *testing.T, h *harness, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(pollDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within %v", what, pollDeadline)
		}
		h.tick()
	}
}

func confRefill(t *testing.T, h *harness) {
	l := Limit{Rate: 1000, Burst: 5, Cost: 1, InitialShare: region.PPM}
	t0 := h.now()
	g := grant1(t, h, "k", 5, l)
	wantGranted(t, g, 5)
	left := g.Tokens
	total := g.Granted
	poll(t, h, "a token refills", func() bool {
		g := grant1(t, h, "k", 1, l)
		total += g.Granted
		if g.Granted == 0 && (g.RetryAfter <= 0 || g.RetryAfter > time.Millisecond) {
			t.Errorf("got retryAfter %v for 1 token at 1000/s, want (0, 1ms]", g.RetryAfter)
		}
		return g.Granted > 0
	})
	elapsed := h.now().Sub(t0).Seconds()
	if max := 5 + 1000*elapsed; float64(total) > max+1e-6 {
		t.Errorf("got %d granted in %.6fs, want ≤ capacity + rate × elapsed = %.3f", total, elapsed, max)
	}
	if min := (1 - left) / 1000; elapsed < min-1e-6 {
		t.Errorf("a token refilled after %.6fs, want ≥ %.6fs at 1000/s", elapsed, min)
	}

	// However long the bucket idles, it holds at most its capacity.
	for range 20 {
		h.tick()
	}
	wantGranted(t, grant1(t, h, "k", 1000, l), 5)
}

func confConcurrent(t *testing.T, h *harness) {
	const (
		workers = 8
		rounds  = 40
		rate    = 2000
		burst   = 50
		cost    = 2
	)
	l := Limit{Rate: rate, Burst: burst, Cost: cost, InitialShare: region.PPM}
	var total atomic.Int64
	var wg sync.WaitGroup
	t0 := h.now()
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				want := cost + rng.Int64N(10)
				g, err := grantOne(h, "hot", want, l)
				if err != nil {
					t.Error(err)
					return
				}
				if g.Granted%cost != 0 || g.Granted > want || g.Tokens < 0 {
					t.Errorf("want %d: got %+v, want a multiple of %d, ≤ want, tokens ≥ 0", want, g, cost)
				}
				total.Add(g.Granted)
				h.tick()
			}
		})
	}
	wg.Wait()
	elapsed := h.now().Sub(t0).Seconds()
	if max := burst + rate*elapsed; float64(total.Load()) > max+1e-6 {
		t.Errorf("got %d granted in %.6fs by %d goroutines, want ≤ capacity + rate × elapsed = %.3f",
			total.Load(), elapsed, workers, max)
	}
	t.Logf("%d tokens granted in %.3fs (bound %.1f)", total.Load(), elapsed, burst+rate*elapsed)
}

func confTTL(t *testing.T, h *harness) {
	l := Limit{Rate: 1000, Burst: 10, Cost: 1, InitialShare: region.PPM}
	wantGranted(t, grant1(t, h, "k", 1, l), 1)
	// 2 × capacity / rate = 20ms, rounded up to whole milliseconds.
	if ttl, ok := h.bucketTTL(t, "k"); !ok || ttl <= 0 || ttl > 21*time.Millisecond {
		t.Errorf("got ttl %v exists %v, want (0, 21ms]", ttl, ok)
	}
	poll(t, h, "the idle bucket expires", func() bool {
		_, ok := h.bucketTTL(t, "k")
		return !ok
	})
	wantGranted(t, grant1(t, h, "k", 100, l), 10) // a new, full bucket

	// A bucket too slow to refill in 2^40 ms is kept, like one at rate 0.
	crawl := Limit{Rate: 1e-12, Burst: 10, Cost: 1, InitialShare: region.PPM}
	wantGranted(t, grant1(t, h, "crawl", 1, crawl), 1)
	if ttl, ok := h.bucketTTL(t, "crawl"); !ok || ttl >= 0 {
		t.Errorf("got ttl %v exists %v, want no expiry", ttl, ok)
	}
}

func confSharePersists(t *testing.T, h *harness) {
	l := Limit{Rate: 1000, Burst: 10, Cost: 1, InitialShare: region.PPM}
	if err := h.store.SetShares(t.Context(), []ShareUpdate{{Key: "k", SharePPM: 500_000, Limit: l}}, nil); err != nil {
		t.Fatal(err)
	}
	g := grant1(t, h, "k", 1, l)
	wantGranted(t, g, 1)
	if g.Rate != 500 || g.Capacity != 5 {
		t.Errorf("got rate %v capacity %v, want 500, 5", g.Rate, g.Capacity)
	}
	poll(t, h, "the idle bucket expires", func() bool {
		_, ok := h.bucketTTL(t, "k")
		return !ok
	})
	got := make([]int64, 1)
	if err := h.store.Shares(t.Context(), []string{"k"}, got); err != nil {
		t.Fatal(err)
	}
	if got[0] != 500_000 {
		t.Errorf("got share %d after the bucket expired, want 500000", got[0])
	}
	g = grant1(t, h, "k", 100, l)
	wantGranted(t, g, 5)
	if g.Capacity != 5 {
		t.Errorf("got capacity %v, want 5", g.Capacity)
	}
}

// confBackwardClock writes a bucket whose last update is an hour ahead of
// the store's clock, as after a failover to a server whose clock is behind,
// or a MemoryStore whose caller's clock jumped back. The store must clamp:
// no refill until its clock passes last, and never a negative balance.
func confBackwardClock(t *testing.T, h *harness) {
	l := Limit{Rate: 1000, Burst: 10, Cost: 1, InitialShare: region.PPM}
	h.setBucket(t, "k", 3, h.now().Add(time.Hour))
	g := grant1(t, h, "k", 10, l)
	wantGranted(t, g, 3)
	if g.Tokens != 0 {
		t.Errorf("got %v tokens left, want 0", g.Tokens)
	}
	h.tick()
	g = grant1(t, h, "k", 1, l)
	wantGranted(t, g, 0)
	if g.Tokens != 0 || g.RetryAfter != time.Millisecond {
		t.Errorf("got tokens %v retryAfter %v, want 0 and 1ms (no refill before last)", g.Tokens, g.RetryAfter)
	}
	// Expiry counts from last, so the bucket outlives the jump.
	if ttl, ok := h.bucketTTL(t, "k"); !ok || ttl < 59*time.Minute {
		t.Errorf("got ttl %v exists %v, want about 1h", ttl, ok)
	}
}

// grantOne is grant1 for goroutines other than the test's: it returns
// errors instead of failing the test.
func grantOne(h *harness, key string, want int64, l Limit) (Grant, error) {
	out := make([]Grant, 1)
	if err := h.store.Grant(context.Background(), []GrantRequest{{Key: key, Want: want, Limit: l}}, out); err != nil {
		return Grant{}, err
	}
	return out[0], out[0].Err
}
