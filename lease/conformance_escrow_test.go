package lease

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/ration-dev/ration/region"
)

// The escrow of tokens with share (docs/DESIGN.md, "Tokens move with
// share"): a lowered share releases the tokens above the new capacity, and a
// store credits the tokens given to its region once per generation.

// setShare1 applies one update and returns its result, failing the test on
// an error.
func setShare1(t *testing.T, h *harness, u ShareUpdate) ShareResult {
	t.Helper()
	out := make([]ShareResult, 1)
	if err := h.store.SetShares(context.Background(), []ShareUpdate{u}, out); err != nil {
		t.Fatalf("SetShares(%+v): %v", u, err)
	}
	return out[0]
}

// wantReleased checks a result's released tokens (TokenScale units), which
// the slow refill between calls may raise by a few thousandths.
func wantReleased(t *testing.T, r ShareResult, want int64) {
	t.Helper()
	if r.Released < want-2 || r.Released > want+5 {
		t.Fatalf("released %d thousandths, want %d (result %+v)", r.Released, want, r)
	}
}

// quarter is a slow limit of burst 400 at an initial share of a quarter:
// capacity 100.
func quarter() Limit {
	l := slow(400, 1)
	l.InitialShare = region.PPM / 4
	return l
}

func confEscrowRelease(t *testing.T, h *harness) {
	l := quarter()
	wantGranted(t, grant1(t, h, "k", 20, l), 20) // 80 of a capacity of 100 left
	r := setShare1(t, h, ShareUpdate{Key: "k", SharePPM: 100_000, Limit: l})
	wantReleased(t, r, 40_000) // 80 − 40
	if math.Abs(r.Tokens-40) > 0.01 {
		t.Errorf("tokens %v after lowering, want 40", r.Tokens)
	}
	// Raising releases nothing and adds nothing by itself.
	r = setShare1(t, h, ShareUpdate{Key: "k", SharePPM: region.PPM, Limit: l})
	wantReleased(t, r, 0)
	wantGranted(t, grant1(t, h, "k", 400, l), 40)
}

func confEscrowMissing(t *testing.T, h *harness) {
	l := quarter()
	// A key nobody used holds a full bucket at its initial share: lowering
	// it releases what is above the new capacity, as for a used one.
	r := setShare1(t, h, ShareUpdate{Key: "unused", SharePPM: 5_000, Limit: l})
	wantReleased(t, r, 98_000) // 100 − 2
	wantGranted(t, grant1(t, h, "unused", 400, l), 2)
	// Raising an unused key's share does not fill it to the new capacity:
	// it holds what it held at the old one.
	setShare1(t, h, ShareUpdate{Key: "raised", SharePPM: region.PPM, Limit: l})
	wantGranted(t, grant1(t, h, "raised", 400, l), 100)
	// A bucket that starts empty releases nothing.
	l.StartEmpty = true
	wantReleased(t, setShare1(t, h, ShareUpdate{Key: "empty", SharePPM: 5_000, Limit: l}), 0)
}

func confEscrowCredit(t *testing.T, h *harness) {
	l := quarter()
	wantGranted(t, grant1(t, h, "k", 100, l), 100) // empty
	// 60 tokens given with 3/4 of the quota: credited at once.
	u := ShareUpdate{Key: "k", SharePPM: region.PPM, Limit: l, Gen: 7, Received: 60_000}
	if r := setShare1(t, h, u); math.Abs(r.Tokens-60) > 0.01 || r.Released != 0 {
		t.Fatalf("after the gift: %+v, want 60 tokens, nothing released", r)
	}
	// The same write again, and an older total, credit nothing more.
	setShare1(t, h, u)
	u.Received = 40_000
	setShare1(t, h, u)
	// More given: only the difference is credited.
	u.Received = 75_500
	setShare1(t, h, u)
	wantGranted(t, grant1(t, h, "k", 400, l), 75)
	if got := grant1(t, h, "k", 400, l); got.Tokens < 0.5 || got.Tokens > 0.52 {
		t.Errorf("tokens %v left, want the half token credited", got.Tokens)
	}
}

func confEscrowGenerations(t *testing.T, h *harness) {
	l := slow(300, 1)
	wantGranted(t, grant1(t, h, "k", 300, l), 300) // empty
	setShare1(t, h, ShareUpdate{Key: "k", SharePPM: region.PPM, Limit: l, Gen: 5, Received: 10_000})
	// An older generation's tokens are never credited in a newer one.
	setShare1(t, h, ShareUpdate{Key: "k", SharePPM: region.PPM, Limit: l, Gen: 4, Received: 90_000})
	// A newer generation counts from nothing.
	setShare1(t, h, ShareUpdate{Key: "k", SharePPM: region.PPM, Limit: l, Gen: 6, Received: 3_000})
	// Gen 0 carries no tokens.
	setShare1(t, h, ShareUpdate{Key: "k", SharePPM: region.PPM, Limit: l, Received: 50_000})
	wantGranted(t, grant1(t, h, "k", 300, l), 13)
	got := make([]int64, 1)
	if err := h.store.Shares(context.Background(), []string{"k"}, got); err != nil || got[0] != region.PPM {
		t.Fatalf("Shares: %v %v, want %d", got, err, region.PPM)
	}
}

func confEscrowCap(t *testing.T, h *harness) {
	l := quarter()
	wantGranted(t, grant1(t, h, "k", 50, l), 50) // 50 of 100 left
	// 120 tokens given with a little share (capacity 160): 10 do not fit,
	// and are released to be given on.
	r := setShare1(t, h, ShareUpdate{Key: "k", SharePPM: 400_000, Limit: l, Gen: 1, Received: 120_000})
	wantReleased(t, r, 10_000)
	if math.Abs(r.Tokens-160) > 0.01 {
		t.Errorf("tokens %v, want 160 (the capacity)", r.Tokens)
	}
}

func confEscrowInvalid(t *testing.T, h *harness) {
	l := slow(300, 1)
	setShare1(t, h, ShareUpdate{Key: "k", SharePPM: 500_000, Limit: l, Gen: 2, Received: 1_000})
	for _, u := range []ShareUpdate{
		{Key: "k", SharePPM: region.PPM, Limit: l, Gen: 2, Received: -1},
		{Key: "k", SharePPM: region.PPM, Limit: l, Gen: 2, Received: 1<<53 + 1},
		{Key: "k", SharePPM: region.PPM, Limit: l, Gen: 1<<53 + 1, Received: 5},
	} {
		err := h.store.SetShares(context.Background(), []ShareUpdate{{Key: "other", SharePPM: 1, Limit: l}, u}, make([]ShareResult, 2))
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("SetShares(%+v): got %v, want ErrInvalid", u, err)
		}
	}
	if err := h.store.SetShares(context.Background(), []ShareUpdate{{Key: "k", SharePPM: 1, Limit: l}}, make([]ShareResult, 2)); !errors.Is(err, ErrInvalid) {
		t.Errorf("SetShares with 2 results for 1 update: got %v, want ErrInvalid", err)
	}
	got := make([]int64, 2)
	if err := h.store.Shares(context.Background(), []string{"k", "other"}, got); err != nil || got[0] != 500_000 || got[1] != -1 {
		t.Fatalf("Shares after rejected batches: %v %v, want [500000 -1]", got, err)
	}
	// The gift of generation 2 is still credited once only.
	wantGranted(t, grant1(t, h, "k", 300, l), 150)
}
