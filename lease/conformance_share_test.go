package lease

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// The cases in this file check a share's lifetime in the store: it lasts
// ShareTTL (confShareTTL here) after its latest write, never less than its
// bucket, and its key holds both (one Redis key per key).

// fast's bucket at share 500,000 holds 5 tokens and expires 20ms after its
// last update, long before confShareTTL.
var fast = Limit{Rate: 1000, Burst: 10, Cost: 1, InitialShare: region.PPM}

func setShare(t *testing.T, h *harness, key string, ppm int64, l Limit) {
	t.Helper()
	if err := h.store.SetShares(t.Context(), []ShareUpdate{{Key: key, SharePPM: ppm, Limit: l}}, nil); err != nil {
		t.Fatalf("SetShares(%q, %d): %v", key, ppm, err)
	}
}

func wantShare(t *testing.T, h *harness, key string, want int64) {
	t.Helper()
	got := make([]int64, 1)
	if err := h.store.Shares(t.Context(), []string{key}, got); err != nil {
		t.Fatal(err)
	}
	if got[0] != want {
		t.Errorf("got share %d for %q, want %d", got[0], key, want)
	}
}

// wantKeyTTL checks that key's lifetime is in [lo, hi] (lo < 0: never).
func wantKeyTTL(t *testing.T, h *harness, key string, lo, hi time.Duration) {
	t.Helper()
	ttl, ok := h.keyTTL(t, key)
	if !ok || ttl < lo || ttl > hi {
		t.Errorf("got key %q ttl %v exists %v, want within [%v, %v]", key, ttl, ok, lo, hi)
	}
}

func confShareExpires(t *testing.T, h *harness) {
	if g := grant1(t, h, "new", 1, fast); g.SharePPM != region.PPM {
		t.Errorf("got share in force %d for a key without a share, want the initial %d", g.SharePPM, region.PPM)
	}
	setShare(t, h, "k", 500_000, fast)
	// A scheduling pause may pass between the write and the look.
	wantKeyTTL(t, h, "k", confShareTTL/2, confShareTTL+time.Millisecond)
	if g := grant1(t, h, "k", 1, fast); g.Granted != 1 || g.SharePPM != 500_000 {
		t.Errorf("got %+v, want 1 granted at share 500000", g)
	}
	wantKeyTTL(t, h, "k", confShareTTL/2, confShareTTL+time.Millisecond) // a grant does not shorten it
	poll(t, h, "the idle bucket expires", func() bool {
		_, ok := h.bucketTTL(t, "k")
		return !ok
	})
	wantShare(t, h, "k", 500_000)
	poll(t, h, "the share expires", func() bool {
		_, ok := h.keyTTL(t, "k")
		return !ok
	})
	wantShare(t, h, "k", -1)
	g := grant1(t, h, "k", 100, fast)
	wantGranted(t, g, 10) // a new bucket at the initial share
	if g.Rate != 1000 || g.SharePPM != region.PPM {
		t.Errorf("got rate %v at share %d after the share expired, want 1000 at %d", g.Rate, g.SharePPM, region.PPM)
	}
}

func confShareWithSlowBucket(t *testing.T, h *harness) {
	l := slow(10, 1) // at share 500,000: 5 tokens at 0.005/s, full after 1000 s
	wantGranted(t, grant1(t, h, "k", 2, l), 2)
	setShare(t, h, "k", 500_000, l)
	wantKeyTTL(t, h, "k", 1990*time.Second, 2001*time.Second) // the bucket's, above ShareTTL
	wantGranted(t, grant1(t, h, "k", 1, l), 1)
	wantKeyTTL(t, h, "k", 1990*time.Second, 2001*time.Second)
	if err := h.store.DeleteShares(t.Context(), []string{"k"}); err != nil {
		t.Fatal(err)
	}
	wantShare(t, h, "k", -1)
	wantKeyTTL(t, h, "k", 1990*time.Second, 2001*time.Second) // still the bucket's
	g := grant1(t, h, "k", 100, l)
	wantGranted(t, g, 4) // the bucket kept its tokens: 10 − 2, clipped to 5, − 1
	if g.Capacity != 10 {
		t.Errorf("got capacity %v after DeleteShares, want 10 (the initial share)", g.Capacity)
	}
}

// confShareExpiredBucket: a key kept by its share treats its bucket as
// missing once the bucket's own expiry passed, exactly as before the share
// moved into the bucket's key: a rule that starts missing buckets empty
// starts it empty again.
func confShareExpiredBucket(t *testing.T, h *harness) {
	l := fast
	l.StartEmpty = true
	setShare(t, h, "k", 500_000, l)
	poll(t, h, "the bucket refills", func() bool { return grant1(t, h, "k", 1, l).Granted == 1 })
	poll(t, h, "the idle bucket expires", func() bool {
		_, ok := h.bucketTTL(t, "k")
		return !ok
	})
	wantShare(t, h, "k", 500_000)
	g := grant1(t, h, "k", 5, l)
	if g.Granted != 0 || g.Capacity != 5 {
		t.Errorf("got %+v, want nothing granted from a new, empty bucket of capacity 5", g)
	}
}

func confDeleteShares(t *testing.T, h *harness) {
	setShare(t, h, "k", 500_000, fast)
	setShare(t, h, "gone", 500_000, fast)
	wantGranted(t, grant1(t, h, "k", 1, fast), 1)
	if err := h.store.DeleteShares(t.Context(), []string{"k"}); err != nil {
		t.Fatal(err)
	}
	wantShare(t, h, "k", -1)
	wantKeyTTL(t, h, "k", 0, 21*time.Millisecond) // back to the bucket's 20ms

	// A key whose bucket expired goes with its share.
	poll(t, h, "the idle bucket expires", func() bool {
		_, ok := h.bucketTTL(t, "gone")
		return !ok
	})
	if err := h.store.DeleteShares(t.Context(), []string{"gone", "never-had-one"}); err != nil {
		t.Fatal(err)
	}
	if ttl, ok := h.keyTTL(t, "gone"); ok {
		t.Errorf("got key ttl %v after DeleteShares of an expired bucket's share, want no key", ttl)
	}
	wantShare(t, h, "gone", -1)
}

// confShareNeverExpires: at share 0 a bucket never refills and never
// expires (it would come back full), so neither does its key.
func confShareNeverExpires(t *testing.T, h *harness) {
	setShare(t, h, "k", 0, fast)
	wantKeyTTL(t, h, "k", -1, -1)
	wantGranted(t, grant1(t, h, "k", 1, fast), 1) // the one cost a share-0 bucket holds
	wantKeyTTL(t, h, "k", -1, -1)
	setShare(t, h, "k", 500_000, fast)
	wantKeyTTL(t, h, "k", confShareTTL/2, confShareTTL+time.Millisecond)
	if err := h.store.DeleteShares(t.Context(), []string{"k"}); err != nil {
		t.Fatal(err)
	}
	wantKeyTTL(t, h, "k", 0, 21*time.Millisecond)
}

// confMaxShare: a grant with MaxShare lowers a share in force above the cap
// to it first, as a share update without tokens would (the tokens above the
// new capacity dropped, the share written with its ShareTTL), and leaves a
// share at or under the cap as it is; a cap outside [0, PPM] or on a fixed
// window is invalid and debits nothing.
func confMaxShare(t *testing.T, h *harness) {
	l := slow(10, 1)
	grantCapped := func(key string, maxShare int64) Grant {
		t.Helper()
		out := make([]Grant, 1)
		if err := h.store.Grant(t.Context(), []GrantRequest{{Key: key, Want: 1, Limit: l, MaxShare: maxShare}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	setShare(t, h, "above", 800_000, l) // 8 tokens
	g := grantCapped("above", 500_000)
	if g.Err != nil || g.Granted != 1 || g.SharePPM != 500_000 || g.Capacity != 5 || math.Abs(g.Tokens-4) > 1e-9 {
		t.Errorf("capped grant: got %+v, want 1 granted at share 500000, capacity 5, 4 left", g)
	}
	wantShare(t, h, "above", 500_000)
	wantKeyTTL(t, h, "above", confShareTTL/2, 2001*time.Second)

	setShare(t, h, "under", 300_000, l) // 3 tokens
	if g := grantCapped("under", 500_000); g.Err != nil || g.Granted != 1 || g.SharePPM != 300_000 {
		t.Errorf("grant under its cap: got %+v, want 1 granted at share 300000", g)
	}
	wantShare(t, h, "under", 300_000)

	// No share: the initial share (all of it for slow) is above the cap.
	if g := grantCapped("none", 400_000); g.Err != nil || g.Granted != 1 || g.SharePPM != 400_000 || math.Abs(g.Tokens-3) > 1e-9 {
		t.Errorf("capped grant of a key without a share: got %+v, want 1 granted at share 400000, 3 left", g)
	}
	wantShare(t, h, "none", 400_000)

	fixed := fixedLimit(10, windowAround(h, time.Second, time.Hour))
	for _, r := range []GrantRequest{
		{Key: "bad", Want: 1, Limit: l, MaxShare: region.PPM + 1},
		{Key: "bad", Want: 1, Limit: l, MaxShare: -1},
		{Key: "bad", Want: 1, Limit: fixed, MaxShare: 500_000},
	} {
		out := make([]Grant, 1)
		if err := h.store.Grant(t.Context(), []GrantRequest{r}, out); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(out[0].Err, ErrInvalid) {
			t.Errorf("max share %d (fixed %v): got %+v, want ErrInvalid", r.MaxShare, r.Limit.Fixed(), out[0])
		}
	}
	wantShare(t, h, "bad", -1)
}
