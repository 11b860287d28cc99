package lease

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/region"
)

// Peek's cases, run against both stores (the conformance suite's harness,
// beside runConformance): a peek reads what a grant would find and changes
// nothing.

type peeker interface {
	Peek(ctx context.Context, key string, l Limit) (BucketState, bool, error)
}

func TestMemoryStorePeek(t *testing.T) { runPeekConformance(t, newMemoryHarness) }

func TestRedisStorePeek(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	runPeekConformance(t, redisHarness(client, RedisConfig{}))
	t.Run("Groups", func(t *testing.T) {
		runPeekConformance(t, redisHarness(client, RedisConfig{Layout: LayoutGroups, Groups: 4}))
	})
}

func runPeekConformance(t *testing.T, newStore func(t *testing.T) *harness) {
	for _, c := range []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"MissingKey", peekMissing},
		{"AfterGrants", peekAfterGrants},
		{"AppliedShare", peekShare},
		{"InvalidKey", peekInvalid},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, newStore(t)) })
	}
}

func peek(t *testing.T, h *harness, key string, l Limit) (BucketState, bool) {
	t.Helper()
	st, ok, err := h.store.(peeker).Peek(context.Background(), key, l)
	if err != nil {
		t.Fatalf("Peek(%q): %v", key, err)
	}
	return st, ok
}

// near reports whether got is want within what slowRate refills in a case.
func nearTokens(got, want float64) bool { return math.Abs(got-want) < 0.1 }

func peekMissing(t *testing.T, h *harness) {
	l := slow(10, 1)
	st, ok := peek(t, h, "none", l)
	if ok || st.Tokens != 10 || st.Capacity != 10 || st.Rate != slowRate || st.SharePPM != region.PPM {
		t.Errorf("missing key: got %+v, ok %v; want the full bucket a grant would start, not ok", st, ok)
	}
	empty := l
	empty.StartEmpty = true
	if st, _ := peek(t, h, "none", empty); st.Tokens != 0 {
		t.Errorf("missing key starting empty: got %v tokens, want 0", st.Tokens)
	}
	if _, exists := h.keyTTL(t, "none"); exists {
		t.Errorf("a peek of a missing key created it")
	}
}

func peekAfterGrants(t *testing.T, h *harness) {
	l := slow(10, 1)
	wantGranted(t, grant1(t, h, "k", 3, l), 3)
	for i := range 3 { // peeking again changes nothing
		st, ok := peek(t, h, "k", l)
		if !ok || !nearTokens(st.Tokens, 7) || st.Capacity != 10 {
			t.Fatalf("peek %d after a grant of 3 of 10: got %+v, ok %v; want about 7 tokens", i, st, ok)
		}
	}
	wantGranted(t, grant1(t, h, "k", 100, l), 7)
	if st, ok := peek(t, h, "k", l); !ok || !nearTokens(st.Tokens, 0) {
		t.Errorf("peek after draining: got %+v, ok %v; want about 0 tokens", st, ok)
	}
}

func peekShare(t *testing.T, h *harness) {
	ctx := context.Background()
	l := slow(100, 1)
	wantGranted(t, grant1(t, h, "k", 1, l), 1)
	if err := h.store.SetShares(ctx, []ShareUpdate{{Key: "k", SharePPM: 250_000, Limit: l}}, nil); err != nil {
		t.Fatal(err)
	}
	st, ok := peek(t, h, "k", l)
	if !ok || st.SharePPM != 250_000 || st.Capacity != 25 || st.Rate != slowRate*0.25 || !nearTokens(st.Tokens, 25) {
		t.Errorf("peek at share 25%%: got %+v, ok %v; want 25 of capacity 25", st, ok)
	}
	// A share without a bucket: the bucket a grant would start, at it.
	if err := h.store.SetShares(ctx, []ShareUpdate{{Key: "fresh", SharePPM: 500_000, Limit: l}}, nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := peek(t, h, "fresh", l); st.SharePPM != 500_000 || st.Capacity != 50 {
		t.Errorf("peek of a share without grants: got %+v, want share 500000 capacity 50", st)
	}
	wantGranted(t, grant1(t, h, "fresh", 100, l), 50)
}

func peekInvalid(t *testing.T, h *harness) {
	if _, _, err := h.store.(peeker).Peek(context.Background(), "", slow(10, 1)); !errors.Is(err, ErrInvalid) {
		t.Errorf("Peek of an empty key: got %v, want ErrInvalid", err)
	}
}
