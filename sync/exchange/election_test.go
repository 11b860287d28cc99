package exchange

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/region"
)

// runElectionContract checks the holder election and the persisted state
// on c. expire makes a hold of ttl lapse: it moves a fake clock, or waits
// on a real server's.
func runElectionContract(t *testing.T, c Coordinator, ttl time.Duration, expire func()) {
	ctx := context.Background()
	acquire := func(reg, holder string, want region.Hold) {
		t.Helper()
		got, err := c.Acquire(ctx, reg, holder, ttl)
		if err != nil {
			t.Fatalf("Acquire(%s, %s): %v", reg, holder, err)
		}
		if got != want {
			t.Fatalf("Acquire(%s, %s): got %v, want %v", reg, holder, got, want)
		}
	}
	load := func(reg string, want SavedState) {
		t.Helper()
		got, err := c.Load(ctx, reg)
		if err != nil {
			t.Fatalf("Load(%s): %v", reg, err)
		}
		if diff := cmp.Diff(want, sortedState(got)); diff != "" {
			t.Fatalf("Load(%s) (-want +got):\n%s", reg, diff)
		}
	}
	whole := func(head string, kv ...string) SavedState {
		st := SavedState{Whole: true, Head: []byte(head)}
		for i := 0; i < len(kv); i += 2 {
			st.Keys = append(st.Keys, kv[i])
			st.Records = append(st.Records, []byte(kv[i+1]))
		}
		return st
	}
	none := SavedState{Whole: true}

	load("eu", none)
	acquire("eu", "a", region.HoldTaken)
	acquire("eu", "a", region.HoldRenewed)
	acquire("eu", "b", region.HoldNone)
	acquire("us", "b", region.HoldTaken) // regions are independent

	partial := SavedState{Head: []byte("h"), Keys: []string{"k"}, Records: [][]byte{[]byte("r")}}
	if err := c.Save(ctx, "eu", "a", partial); !errors.Is(err, ErrNoWholeState) {
		t.Fatalf("a partial state with nothing stored: got %v, want ErrNoWholeState", err)
	}
	load("eu", none)
	if err := c.Save(ctx, "eu", "a", whole("state-1", "k1", "a", "k2", "b")); err != nil {
		t.Fatalf("holder saves: %v", err)
	}
	if err := c.Save(ctx, "eu", "b", whole("state-b")); !errors.Is(err, region.ErrNotHolder) {
		t.Fatalf("non-holder saves: got %v, want ErrNotHolder", err)
	}
	load("eu", whole("state-1", "k1", "a", "k2", "b"))
	load("us", none)
	// A partial save replaces the head and its keys' records, deleting
	// first: a key deleted and written again is kept.
	part := SavedState{Head: []byte("state-1b"), Keys: []string{"k2", "k3"}, Records: [][]byte{[]byte("B"), []byte("c")}, Deleted: []string{"k1", "k3"}}
	if err := c.Save(ctx, "eu", "a", part); err != nil {
		t.Fatalf("holder saves a partial state: %v", err)
	}
	load("eu", whole("state-1b", "k2", "B", "k3", "c"))

	// A lapsed hold: another replica takes it, the old holder's writes fail.
	expire()
	acquire("eu", "b", region.HoldTaken)
	if err := c.Save(ctx, "eu", "a", whole("late")); !errors.Is(err, region.ErrNotHolder) {
		t.Fatalf("old holder saves after losing the hold: got %v, want ErrNotHolder", err)
	}
	load("eu", whole("state-1b", "k2", "B", "k3", "c"))
	if err := c.Save(ctx, "eu", "b", whole("state-2", "k9", "z")); err != nil {
		t.Fatal(err)
	}
	load("eu", whole("state-2", "k9", "z")) // a whole save replaces everything

	// Release by a non-holder does nothing; by the holder frees the hold.
	if err := c.Release(ctx, "eu", "a"); err != nil {
		t.Fatal(err)
	}
	acquire("eu", "a", region.HoldNone)
	if err := c.Release(ctx, "eu", "b"); err != nil {
		t.Fatal(err)
	}
	acquire("eu", "a", region.HoldTaken)
	load("eu", whole("state-2", "k9", "z")) // the state outlives holds

	for name, err := range map[string]error{
		"empty region": func() error { _, err := c.Acquire(ctx, "", "a", ttl); return err }(),
		"empty holder": func() error { _, err := c.Acquire(ctx, "eu", "", ttl); return err }(),
		"zero ttl":     func() error { _, err := c.Acquire(ctx, "eu", "a", 0); return err }(),
		"save empty":   c.Save(ctx, "", "a", SavedState{}),
		"save uneven":  c.Save(ctx, "eu", "a", SavedState{Keys: []string{"k"}}),
		"save no key":  c.Save(ctx, "eu", "a", SavedState{Keys: []string{""}, Records: [][]byte{nil}}),
		"load empty":   func() error { _, err := c.Load(ctx, ""); return err }(),
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", name, err)
		}
	}
}

// sortedState is st with its records in order of their keys.
func sortedState(st SavedState) SavedState {
	idx := make([]int, len(st.Keys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return strings.Compare(st.Keys[a], st.Keys[b]) })
	out := SavedState{Whole: st.Whole, Head: st.Head}
	for _, i := range idx {
		out.Keys = append(out.Keys, st.Keys[i])
		out.Records = append(out.Records, st.Records[i])
	}
	return out
}

func TestMemoryCoordinatorContract(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	m := NewMemoryCoordinator(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	const ttl = 3 * time.Second
	runElectionContract(t, m, ttl, func() {
		mu.Lock()
		now = now.Add(ttl)
		mu.Unlock()
	})
}

func TestRedisCoordinatorContract(t *testing.T) {
	c, s, client := redisCoordinatorFixture(t)
	if got, want := c.key("e{u}", "lease"), s.Config().Prefix+"exchange:{e%7Bu%7D}:lease"; got != want {
		t.Errorf("got hold key %q, want %q", got, want)
	}
	// The whole state as releases before records kept it, a string, is
	// read as the head, and the first whole save replaces it.
	if err := client.Set(context.Background(), c.key("old", "state"), "blob", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Load(context.Background(), "old"); err != nil || string(st.Head) != "blob" || len(st.Keys) != 0 {
		t.Fatalf("Load of the old format: %+v, %v", st, err)
	}
	if _, err := c.Acquire(context.Background(), "old", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.Save(context.Background(), "old", "a", SavedState{Head: []byte("h")}); !errors.Is(err, ErrNoWholeState) {
		t.Fatalf("a partial save over the old format: got %v, want ErrNoWholeState", err)
	}
	if err := c.Save(context.Background(), "old", "a", SavedState{Whole: true, Head: []byte("h")}); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Load(context.Background(), "old"); err != nil || string(st.Head) != "h" {
		t.Fatalf("Load after the whole save: %+v, %v", st, err)
	}
	const ttl = 100 * time.Millisecond
	runElectionContract(t, c, ttl, func() {
		// Redis times the hold by its own clock: poll until it lapsed.
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, err := client.Exists(context.Background(), c.key("eu", "lease")).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("hold did not lapse within 5s")
			}
			time.Sleep(10 * time.Millisecond) // polling interval, not a wait for an event
		}
	})
}
