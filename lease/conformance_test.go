package lease

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/region"
)

// conformanceStore is what the conformance suite needs of a store: the
// methods that MemoryStore and RedisStore share.
type conformanceStore interface {
	Grant(ctx context.Context, reqs []GrantRequest, out []Grant) error
	Return(ctx context.Context, reqs []ReturnRequest) error
	SetShares(ctx context.Context, ups []ShareUpdate, out []ShareResult) error
	Shares(ctx context.Context, keys []string, out []int64) error
	DeleteShares(ctx context.Context, keys []string) error
	Ping(ctx context.Context) error
}

// harness is a fresh, empty store plus the few store-specific operations
// that the suite needs to observe time and expiry.
type harness struct {
	store conformanceStore
	// now reads a clock whose differences bound the store's elapsed time:
	// the fake clock of a MemoryStore, time.Now for Redis on this host.
	now func() time.Time
	// tick lets a little store time pass between the polls of a loop that
	// waits for a condition: a MemoryStore's clock moves 1ms; with Redis
	// it is the poll interval.
	tick func()
	// bucketTTL is the bucket's remaining lifetime: exists is false once it
	// is gone, and ttl < 0 means it never expires.
	bucketTTL func(t *testing.T, key string) (ttl time.Duration, exists bool)
	// setBucket writes a bucket's state directly, bypassing the contract;
	// the key then never expires.
	setBucket func(t *testing.T, key string, tokens float64, last time.Time)
	// keyTTL is the remaining lifetime of all the store keeps for key
	// (bucket and share): exists is false once nothing is left, and ttl < 0
	// means it never expires.
	keyTTL func(t *testing.T, key string) (ttl time.Duration, exists bool)
}

// confShareTTL is the stores' ShareTTL in the suite: long enough that no
// other case sees a share expire, short enough to wait for with Redis.
const confShareTTL = time.Second

// Limits used by the cases. slowRate refills less than 0.1 token in the
// 10 s that a case may take, so cases can expect exact grants from it.
const slowRate = 0.01

func slow(burst float64, cost int64) Limit {
	return Limit{Rate: slowRate, Burst: burst, Cost: cost, InitialShare: region.PPM}
}

// runConformance runs the allocator contract's cases against stores made
// by newStore, one store per case.
func runConformance(t *testing.T, newStore func(t *testing.T) *harness) {
	cases := []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"PartialGrant", confPartialGrant},
		{"CostMultiples", confCostMultiples},
		{"ReturnCapsAtCapacity", confReturn},
		{"StartEmpty", confStartEmpty},
		{"InvalidDebitsNothing", confInvalid},
		{"InvalidBatchesChangeNothing", confInvalidBatches},
		{"MixedBatch", confMixedBatch},
		{"SetSharesLowerClips", confSetShares},
		{"SharesUnset", confSharesUnset},
		{"ShareZero", confShareZero},
		{"KeysWithBraces", confBraces},
		{"Refill", confRefill},
		{"ConcurrentGrantsBound", confConcurrent},
		{"TTLExpiry", confTTL},
		{"SharePersistsAfterExpiry", confSharePersists},
		{"ShareExpiresAfterShareTTL", confShareExpires},
		{"ShareLivesWithALongerBucket", confShareWithSlowBucket},
		{"ShareKeepsAnExpiredBucketMissing", confShareExpiredBucket},
		{"DeleteSharesFallsBackToTheBucket", confDeleteShares},
		{"ShareOfABucketThatNeverExpires", confShareNeverExpires},
		{"MaxShareCapsTheGrant", confMaxShare},
		{"RaiseCarriedByTheGrant", confRaiseAtGrant},
		{"BackwardClockClamp", confBackwardClock},
		{"EscrowLowerReleases", confEscrowRelease},
		{"EscrowMissingBucketReleasesWhatItHeld", confEscrowMissing},
		{"EscrowCreditsOnce", confEscrowCredit},
		{"EscrowGenerations", confEscrowGenerations},
		{"EscrowCreditCappedReleasesTheRest", confEscrowCap},
		{"EscrowInvalidChangesNothing", confEscrowInvalid},
		{"FixedWindow", confFixedWindow},
		{"FixedWindowOutsideItsBoundaries", confFixedWindowOutside},
		{"FixedWindowEscrow", confFixedWindowEscrow},
		{"FixedWindowAcrossDST", confFixedWindowDST},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, newStore(t)) })
	}
}

// grant1 grants one item and fails the test on a call error.
func grant1(t *testing.T, h *harness, key string, want int64, l Limit) Grant {
	t.Helper()
	out := make([]Grant, 1)
	if err := h.store.Grant(context.Background(), []GrantRequest{{Key: key, Want: want, Limit: l}}, out); err != nil {
		t.Fatalf("Grant(%q, %d): %v", key, want, err)
	}
	if out[0].Err != nil {
		t.Fatalf("Grant(%q, %d): item error %v", key, want, out[0].Err)
	}
	return out[0]
}

func wantGranted(t *testing.T, g Grant, want int64) {
	t.Helper()
	if g.Granted != want {
		t.Fatalf("granted %d, want %d (grant %+v)", g.Granted, want, g)
	}
}

func confPartialGrant(t *testing.T, h *harness) {
	l := slow(10, 1)
	g := grant1(t, h, "k", 25, l)
	wantGranted(t, g, 10)
	if g.Capacity != 10 || g.Rate != slowRate || g.RetryAfter != 0 {
		t.Errorf("got capacity %v rate %v retryAfter %v, want 10, %v, 0", g.Capacity, g.Rate, g.RetryAfter, slowRate)
	}
	if g.Tokens < 0 || g.Tokens >= 0.1 {
		t.Errorf("got %v tokens left, want [0, 0.1)", g.Tokens)
	}
	g = grant1(t, h, "k", 3, l)
	wantGranted(t, g, 0)
	// One token at 0.01/s takes 100 s, less what refilled meanwhile.
	if g.RetryAfter <= 90*time.Second || g.RetryAfter > 100*time.Second {
		t.Errorf("got retryAfter %v, want (90s, 100s]", g.RetryAfter)
	}
}

func confCostMultiples(t *testing.T, h *harness) {
	l := slow(100, 7)
	for _, step := range []struct{ want, granted int64 }{
		{50, 49},  // 7 requests of 7 fit in the want
		{100, 49}, // 51 tokens left hold 7 requests
		{7, 0},    // 2 tokens left
	} {
		g := grant1(t, h, "k", step.want, l)
		wantGranted(t, g, step.granted)
	}
	g := grant1(t, h, "k", 7, l)
	if g.RetryAfter <= 0 {
		t.Errorf("got retryAfter %v with 0 granted, want > 0", g.RetryAfter)
	}
	out := make([]Grant, 1)
	if err := h.store.Grant(context.Background(), []GrantRequest{{Key: "k", Want: 6, Limit: l}}, out); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(out[0].Err, ErrInvalid) {
		t.Errorf("want 6 below cost 7: got err %v, want ErrInvalid", out[0].Err)
	}
}

func confReturn(t *testing.T, h *harness) {
	ctx := context.Background()
	l := slow(10, 1)
	wantGranted(t, grant1(t, h, "k", 10, l), 10)
	if err := h.store.Return(ctx, []ReturnRequest{{Key: "k", Tokens: 4, Limit: l}}); err != nil {
		t.Fatal(err)
	}
	wantGranted(t, grant1(t, h, "k", 10, l), 4)
	if err := h.store.Return(ctx, []ReturnRequest{{Key: "k", Tokens: 100, Limit: l}}); err != nil {
		t.Fatal(err)
	}
	g := grant1(t, h, "k", 100, l)
	wantGranted(t, g, 10) // capped at capacity
	// Returning to a bucket that does not exist yet: full stays full, and
	// an empty start gets what was returned.
	if err := h.store.Return(ctx, []ReturnRequest{{Key: "fresh", Tokens: 3, Limit: l}}); err != nil {
		t.Fatal(err)
	}
	wantGranted(t, grant1(t, h, "fresh", 100, l), 10)
	le := l
	le.StartEmpty = true
	if err := h.store.Return(ctx, []ReturnRequest{{Key: "fresh-empty", Tokens: 3, Limit: le}}); err != nil {
		t.Fatal(err)
	}
	wantGranted(t, grant1(t, h, "fresh-empty", 100, le), 3)
}

func confStartEmpty(t *testing.T, h *harness) {
	l := slow(10, 1)
	l.StartEmpty = true
	g := grant1(t, h, "k", 1, l)
	wantGranted(t, g, 0)
	if g.RetryAfter < 99*time.Second || g.RetryAfter > 100*time.Second {
		t.Errorf("got retryAfter %v, want about 100s", g.RetryAfter)
	}
}

func confInvalid(t *testing.T, h *harness) {
	ctx := context.Background()
	good := slow(10, 1)
	with := func(f func(*Limit)) Limit { l := good; f(&l); return l }
	bad := []GrantRequest{
		{Key: "k", Want: 0, Limit: good},
		{Key: "k", Want: -5, Limit: good},
		{Key: "", Want: 1, Limit: good},
		{Key: "k", Want: 1, Limit: with(func(l *Limit) { l.Cost = 11 })},
		{Key: "k", Want: 1, Limit: with(func(l *Limit) { l.Cost = 0 })},
		{Key: "k", Want: 1, Limit: with(func(l *Limit) { l.Cost = -1 })},
		{Key: "k", Want: 1, Limit: with(func(l *Limit) { l.Rate = math.NaN() })},
		{Key: "k", Want: 1, Limit: with(func(l *Limit) { l.Rate = math.Inf(1) })},
		{Key: "k", Want: 1, Limit: with(func(l *Limit) { l.Rate = 0 })},
		{Key: "k", Want: 1, Limit: with(func(l *Limit) { l.Rate = -1 })},
		{Key: "k", Want: 1, Limit: with(func(l *Limit) { l.Burst = math.Inf(-1) })},
		{Key: "k", Want: 1, Limit: with(func(l *Limit) { l.Burst = math.NaN() })},
		{Key: "k", Want: 1, Limit: with(func(l *Limit) { l.InitialShare = -1 })},
		{Key: "k", Want: 1, Limit: with(func(l *Limit) { l.InitialShare = region.PPM + 1 })},
		{Key: "k", Want: 2, Limit: with(func(l *Limit) { l.Cost = 3 })}, // want below cost
	}
	out := make([]Grant, len(bad))
	if err := h.store.Grant(ctx, bad, out); err != nil {
		t.Fatalf("Grant of invalid items: got call error %v, want per-item errors", err)
	}
	for i, g := range out {
		if !errors.Is(g.Err, ErrInvalid) || g.Granted != 0 {
			t.Errorf("item %d (%+v): got %+v, want Err wrapping ErrInvalid and nothing granted", i, bad[i], g)
		}
	}
	if err := h.store.Grant(ctx, bad[:1], nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Grant with short out: got %v, want ErrInvalid", err)
	}
	wantGranted(t, grant1(t, h, "k", 10, good), 10) // nothing was debited
}

func confInvalidBatches(t *testing.T, h *harness) {
	ctx := context.Background()
	l := slow(10, 1)
	wantGranted(t, grant1(t, h, "k", 10, l), 10)
	nan := l
	nan.Burst = math.NaN()
	for _, batch := range [][]ReturnRequest{
		{{Key: "k", Tokens: 5, Limit: l}, {Key: "k", Tokens: 0, Limit: l}},
		{{Key: "k", Tokens: 5, Limit: l}, {Key: "k", Tokens: -3, Limit: l}},
		{{Key: "k", Tokens: 5, Limit: l}, {Key: "", Tokens: 3, Limit: l}},
		{{Key: "k", Tokens: 5, Limit: l}, {Key: "k", Tokens: 3, Limit: nan}},
	} {
		if err := h.store.Return(ctx, batch); !errors.Is(err, ErrInvalid) {
			t.Errorf("Return(%+v): got %v, want ErrInvalid", batch, err)
		}
	}
	wantGranted(t, grant1(t, h, "k", 10, l), 0) // no valid item was applied either

	for _, batch := range [][]ShareUpdate{
		{{Key: "k", SharePPM: 1000, Limit: l}, {Key: "k", SharePPM: -1, Limit: l}},
		{{Key: "k", SharePPM: 1000, Limit: l}, {Key: "k", SharePPM: region.PPM + 1, Limit: l}},
		{{Key: "k", SharePPM: 1000, Limit: l}, {Key: "", SharePPM: 1000, Limit: l}},
		{{Key: "k", SharePPM: 1000, Limit: l}, {Key: "k", SharePPM: 1000, Limit: nan}},
	} {
		if err := h.store.SetShares(ctx, batch, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetShares(%+v): got %v, want ErrInvalid", batch, err)
		}
	}
	got := make([]int64, 1)
	if err := h.store.Shares(ctx, []string{"k"}, got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int64{-1}, got); diff != "" {
		t.Errorf("shares after rejected SetShares (-want +got):\n%s", diff)
	}
}

func confMixedBatch(t *testing.T, h *harness) {
	l := slow(10, 1)
	nan := l
	nan.Rate = math.NaN()
	reqs := []GrantRequest{
		{Key: "a", Want: 3, Limit: l},
		{Key: "b", Want: 0, Limit: l},
		{Key: "c", Want: 4, Limit: l},
		{Key: "", Want: 1, Limit: l},
		{Key: "a", Want: 3, Limit: l},
		{Key: "a", Want: 3, Limit: nan},
	}
	out := make([]Grant, len(reqs))
	if err := h.store.Grant(context.Background(), reqs, out); err != nil {
		t.Fatal(err)
	}
	var granted []int64
	var invalid []bool
	for _, g := range out {
		granted = append(granted, g.Granted)
		invalid = append(invalid, errors.Is(g.Err, ErrInvalid))
	}
	if diff := cmp.Diff([]int64{3, 0, 4, 0, 3, 0}, granted); diff != "" {
		t.Errorf("granted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]bool{false, true, false, true, false, true}, invalid); diff != "" {
		t.Errorf("invalid (-want +got):\n%s", diff)
	}
	wantGranted(t, grant1(t, h, "a", 100, l), 4)  // 10 − 3 − 3
	wantGranted(t, grant1(t, h, "b", 100, l), 10) // untouched
}

func confSetShares(t *testing.T, h *harness) {
	ctx := context.Background()
	l := slow(100, 1)
	wantGranted(t, grant1(t, h, "k", 1, l), 1) // bucket exists with 99
	if err := h.store.SetShares(ctx, []ShareUpdate{{Key: "k", SharePPM: 250_000, Limit: l}}, nil); err != nil {
		t.Fatal(err)
	}
	g := grant1(t, h, "k", 100, l)
	wantGranted(t, g, 25) // clipped to the new capacity
	if g.Capacity != 25 || g.Rate != slowRate*0.25 {
		t.Errorf("got capacity %v rate %v, want 25, %v", g.Capacity, g.Rate, slowRate*0.25)
	}
	// Raising the share raises capacity, not tokens.
	if err := h.store.SetShares(ctx, []ShareUpdate{{Key: "k", SharePPM: region.PPM, Limit: l}}, nil); err != nil {
		t.Fatal(err)
	}
	g = grant1(t, h, "k", 100, l)
	wantGranted(t, g, 0)
	if g.Capacity != 100 {
		t.Errorf("got capacity %v, want 100", g.Capacity)
	}
	// Lowering clips at once, not at the next grant: tokens above the lower
	// capacity are gone even if the share comes back before anyone asks.
	wantGranted(t, grant1(t, h, "clip", 1, l), 1) // 99 left
	if err := h.store.SetShares(ctx, []ShareUpdate{
		{Key: "clip", SharePPM: 100_000, Limit: l},
		{Key: "clip", SharePPM: region.PPM, Limit: l},
	}, nil); err != nil {
		t.Fatal(err)
	}
	wantGranted(t, grant1(t, h, "clip", 100, l), 10)
	// A key without a bucket has the one it stands for, full at its old
	// share (here the initial share, all of it); lowering clips it.
	if err := h.store.SetShares(ctx, []ShareUpdate{{Key: "new", SharePPM: 500_000, Limit: l}}, nil); err != nil {
		t.Fatal(err)
	}
	wantGranted(t, grant1(t, h, "new", 100, l), 50)
	got := make([]int64, 2)
	if err := h.store.Shares(ctx, []string{"k", "new"}, got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int64{region.PPM, 500_000}, got); diff != "" {
		t.Errorf("shares (-want +got):\n%s", diff)
	}
}

func confSharesUnset(t *testing.T, h *harness) {
	ctx := context.Background()
	got := make([]int64, 2)
	if err := h.store.Shares(ctx, []string{"a", "b"}, got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int64{-1, -1}, got); diff != "" {
		t.Errorf("shares (-want +got):\n%s", diff)
	}
	if err := h.store.Shares(ctx, []string{"a"}, got); !errors.Is(err, ErrInvalid) {
		t.Errorf("Shares with a longer out: got %v, want ErrInvalid", err)
	}
	if err := h.store.Shares(ctx, []string{""}, got[:1]); !errors.Is(err, ErrInvalid) {
		t.Errorf("Shares of an empty key: got %v, want ErrInvalid", err)
	}
	if err := h.store.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

func confShareZero(t *testing.T, h *harness) {
	l := Limit{Rate: 1000, Burst: 100, Cost: 3, InitialShare: 0}
	g := grant1(t, h, "k", 9, l)
	wantGranted(t, g, 3) // capacity never drops below one cost
	if g.Rate != 0 || g.Capacity != 3 {
		t.Errorf("got rate %v capacity %v, want 0, 3", g.Rate, g.Capacity)
	}
	g = grant1(t, h, "k", 3, l)
	wantGranted(t, g, 0)
	if g.RetryAfter != NoRefillRetryAfter {
		t.Errorf("got retryAfter %v at rate 0, want NoRefillRetryAfter %v", g.RetryAfter, NoRefillRetryAfter)
	}
	ttl, ok := h.bucketTTL(t, "k")
	if !ok || ttl >= 0 {
		t.Errorf("got ttl %v exists %v for a bucket that never refills, want no expiry", ttl, ok)
	}
}

func confBraces(t *testing.T, h *harness) {
	l := slow(10, 1)
	keys := []string{"a", "{a}", "a}", "}{", "{", "%7Ba%7D", "{a}:b", "x:{a}"}
	for i, k := range keys {
		wantGranted(t, grant1(t, h, k, int64(i+1), l), int64(i+1))
	}
	for i, k := range keys {
		wantGranted(t, grant1(t, h, k, 100, l), int64(10-(i+1)))
	}
}
