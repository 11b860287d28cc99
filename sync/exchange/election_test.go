package exchange

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/lease"
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
	load := func(reg string, want []byte) {
		t.Helper()
		got, err := c.Load(ctx, reg)
		if err != nil {
			t.Fatalf("Load(%s): %v", reg, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("Load(%s) (-want +got):\n%s", reg, diff)
		}
	}

	load("eu", nil)
	acquire("eu", "a", region.HoldTaken)
	acquire("eu", "a", region.HoldRenewed)
	acquire("eu", "b", region.HoldNone)
	acquire("us", "b", region.HoldTaken) // regions are independent

	if err := c.Save(ctx, "eu", "a", []byte("state-1")); err != nil {
		t.Fatalf("holder saves: %v", err)
	}
	if err := c.Save(ctx, "eu", "b", []byte("state-b")); !errors.Is(err, region.ErrNotHolder) {
		t.Fatalf("non-holder saves: got %v, want ErrNotHolder", err)
	}
	load("eu", []byte("state-1"))
	load("us", nil)

	// A lapsed hold: another replica takes it, the old holder's writes fail.
	expire()
	acquire("eu", "b", region.HoldTaken)
	if err := c.Save(ctx, "eu", "a", []byte("late")); !errors.Is(err, region.ErrNotHolder) {
		t.Fatalf("old holder saves after losing the hold: got %v, want ErrNotHolder", err)
	}
	load("eu", []byte("state-1"))
	if err := c.Save(ctx, "eu", "b", []byte("state-2")); err != nil {
		t.Fatal(err)
	}
	load("eu", []byte("state-2"))

	// Release by a non-holder does nothing; by the holder frees the hold.
	if err := c.Release(ctx, "eu", "a"); err != nil {
		t.Fatal(err)
	}
	acquire("eu", "a", region.HoldNone)
	if err := c.Release(ctx, "eu", "b"); err != nil {
		t.Fatal(err)
	}
	acquire("eu", "a", region.HoldTaken)
	load("eu", []byte("state-2")) // the state outlives holds

	for name, err := range map[string]error{
		"empty region": func() error { _, err := c.Acquire(ctx, "", "a", ttl); return err }(),
		"empty holder": func() error { _, err := c.Acquire(ctx, "eu", "", ttl); return err }(),
		"zero ttl":     func() error { _, err := c.Acquire(ctx, "eu", "a", 0); return err }(),
		"save empty":   c.Save(ctx, "", "a", nil),
		"load empty":   func() error { _, err := c.Load(ctx, ""); return err }(),
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", name, err)
		}
	}
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
	client, err := lease.NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s, err := lease.NewRedisStore(client, lease.RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := NewRedisCoordinator(s)
	if got, want := c.key("e{u}", "lease"), s.Config().Prefix+"exchange:{e%7Bu%7D}:lease"; got != want {
		t.Errorf("got hold key %q, want %q", got, want)
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
