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

// confRaiseAtGrant: a grant that carries a raise (GrantRequest.Raise)
// applies it as a share write Age before the store's now would have: the
// bucket refills at the share in force until then (never before its last
// update) and at the raised share since; the raise's tokens are credited
// once by generation, and its share kept with its ShareTTL. An invalid
// raise debits nothing.
func confRaiseAtGrant(t *testing.T, h *harness) {
	l := Limit{Rate: 0.1, Burst: 100, Cost: 1, InitialShare: 200_000}
	grantRaised := func(key string, want int64, r ShareRaise) Grant {
		t.Helper()
		out := make([]Grant, 1)
		if err := h.store.Grant(t.Context(), []GrantRequest{{Key: key, Want: want, Limit: l, Raise: &r}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	// Empty 100 s ago; raised 50.5 s ago: 49.5 s at 0.02/s, 50.5 s at 0.06/s.
	h.setBucket(t, "aged", 0, h.now().Add(-100*time.Second))
	g := grantRaised("aged", 10, ShareRaise{Steps: []ShareStep{{SharePPM: 600_000, Age: 50500 * time.Millisecond}}})
	if g.Err != nil || g.Granted != 4 || g.SharePPM != 600_000 || g.Capacity != 60 || math.Abs(g.Tokens-0.02) > 0.005 {
		t.Errorf("raise 50.5 s old: got %+v, want 4 granted at share 600000, capacity 60, 0.02 left", g)
	}
	wantShare(t, h, "aged", 600_000)
	wantKeyTTL(t, h, "aged", confShareTTL/2, 2001*time.Second)

	// Older than the bucket's last update: the new share counts from then.
	h.setBucket(t, "older", 0, h.now().Add(-10*time.Second))
	if g := grantRaised("older", 10, ShareRaise{Steps: []ShareStep{{SharePPM: 600_000, Age: 50 * time.Second}}}); g.Err != nil || g.Granted != 0 || math.Abs(g.Tokens-0.6) > 0.005 {
		t.Errorf("raise older than the bucket's last update: got %+v, want nothing granted, 0.6 left", g)
	}

	// Tokens received with the raise, credited once.
	h.setBucket(t, "tokens", 0, h.now())
	raise := ShareRaise{Steps: []ShareStep{{SharePPM: 600_000}}, Gen: 3, Received: 2000}
	if g := grantRaised("tokens", 10, raise); g.Err != nil || g.Granted != 2 {
		t.Errorf("raise with 2 tokens: got %+v, want 2 granted", g)
	}
	if g := grantRaised("tokens", 10, raise); g.Err != nil || g.Granted != 0 {
		t.Errorf("the same raise again: got %+v, want nothing granted", g)
	}

	// Steps: the initial 0.2 until 40 s ago, 0.8 until 20 s ago, then 0.4:
	// 20 s × (0.02 + 0.08 + 0.04)/s = 2.8 tokens.
	h.setBucket(t, "steps", 0, h.now().Add(-60*time.Second))
	g = grantRaised("steps", 10, ShareRaise{Steps: []ShareStep{{SharePPM: 800_000, Age: 40 * time.Second}, {SharePPM: 400_000, Age: 20 * time.Second}}})
	if g.Err != nil || g.Granted != 2 || g.SharePPM != 400_000 || math.Abs(g.Tokens-0.8) > 0.005 {
		t.Errorf("raise in two steps: got %+v, want 2 granted at share 400000, 0.8 left", g)
	}

	// A share write after steps it carries (ShareUpdate.Steps): 20 s at
	// 0.2, 40 s at 0.8 (3.6 tokens), then lowered to 0.03: capacity 3, 0.6
	// released.
	h.setBucket(t, "written", 0, h.now().Add(-60*time.Second))
	res := make([]ShareResult, 1)
	if err := h.store.SetShares(t.Context(), []ShareUpdate{{Key: "written", SharePPM: 30_000, Limit: l, Steps: []ShareStep{{SharePPM: 800_000, Age: 40 * time.Second}}}}, res); err != nil {
		t.Fatal(err)
	}
	if math.Abs(float64(res[0].Released)-600) > 5 || res[0].Tokens != 3 {
		t.Errorf("share write after a step: got %+v, want 600 released, 3 left", res[0])
	}
	wantShare(t, h, "written", 30_000)
	for _, u := range []ShareUpdate{
		{Key: "bad", SharePPM: 30_000, Limit: l, Steps: []ShareStep{{SharePPM: 0}}},
		{Key: "bad", SharePPM: 30_000, Limit: l, Steps: make([]ShareStep, MaxRaiseSteps+1)},
		{Key: "bad", SharePPM: 30_000, Limit: fixedLimit(10, windowAround(h, time.Second, time.Hour)), Steps: []ShareStep{{SharePPM: 500_000}}},
	} {
		if err := h.store.SetShares(t.Context(), []ShareUpdate{u}, res); !errors.Is(err, ErrInvalid) {
			t.Errorf("share write with steps %+v (fixed %v): got %v, want ErrInvalid", u.Steps, u.Limit.Fixed(), err)
		}
	}

	fixed := fixedLimit(10, windowAround(h, time.Second, time.Hour))
	step := func(ppm int64, age time.Duration) *ShareRaise {
		return &ShareRaise{Steps: []ShareStep{{SharePPM: ppm, Age: age}}}
	}
	for _, r := range []GrantRequest{
		{Key: "bad", Want: 1, Limit: l, Raise: step(0, 0)},
		{Key: "bad", Want: 1, Limit: l, Raise: step(region.PPM+1, 0)},
		{Key: "bad", Want: 1, Limit: l, Raise: step(500_000, -time.Second)},
		{Key: "bad", Want: 1, Limit: l, Raise: step(500_000, MaxRaiseAge+time.Second)},
		{Key: "bad", Want: 1, Limit: l, Raise: &ShareRaise{Steps: step(500_000, 0).Steps, Received: -1}},
		{Key: "bad", Want: 1, Limit: l, Raise: &ShareRaise{}},
		{Key: "bad", Want: 1, Limit: l, Raise: &ShareRaise{Steps: make([]ShareStep, MaxRaiseSteps+1)}},
		{Key: "bad", Want: 1, Limit: l, Raise: &ShareRaise{Steps: []ShareStep{{SharePPM: 500_000, Age: time.Second}, {SharePPM: 600_000, Age: 2 * time.Second}}}},
		{Key: "bad", Want: 1, Limit: l, MaxShare: 400_000, Raise: step(500_000, 0)},
		{Key: "bad", Want: 1, Limit: fixed, Raise: step(500_000, 0)},
	} {
		out := make([]Grant, 1)
		if err := h.store.Grant(t.Context(), []GrantRequest{r}, out); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(out[0].Err, ErrInvalid) {
			t.Errorf("raise %+v, max share %d (fixed %v): got %+v, want ErrInvalid", *r.Raise, r.MaxShare, r.Limit.Fixed(), out[0])
		}
	}
	wantShare(t, h, "bad", -1)
}
