package lease

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/internal/redistest"
)

// exchangeStore is the exchange contract both implementations share.
type exchangeStore interface {
	AcquireExchange(ctx context.Context, region, holder string, ttl time.Duration) (ExchangeHold, error)
	ReleaseExchange(ctx context.Context, region, holder string) error
	SaveExchangeState(ctx context.Context, region, holder string, state []byte) error
	LoadExchangeState(ctx context.Context, region string) ([]byte, error)
}

// runExchangeContract checks the exchange lease and state on s. expire
// makes a lease of ttl lapse: it moves a fake clock, or waits on a real
// server's.
func runExchangeContract(t *testing.T, s exchangeStore, ttl time.Duration, expire func()) {
	ctx := context.Background()
	acquire := func(region, holder string, want ExchangeHold) {
		t.Helper()
		got, err := s.AcquireExchange(ctx, region, holder, ttl)
		if err != nil {
			t.Fatalf("AcquireExchange(%s, %s): %v", region, holder, err)
		}
		if got != want {
			t.Fatalf("AcquireExchange(%s, %s): got %v, want %v", region, holder, got, want)
		}
	}
	load := func(region string, want []byte) {
		t.Helper()
		got, err := s.LoadExchangeState(ctx, region)
		if err != nil {
			t.Fatalf("LoadExchangeState(%s): %v", region, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("LoadExchangeState(%s) (-want +got):\n%s", region, diff)
		}
	}

	load("eu", nil)
	acquire("eu", "a", HoldTaken)
	acquire("eu", "a", HoldRenewed)
	acquire("eu", "b", HoldNone)
	acquire("us", "b", HoldTaken) // regions are independent

	if err := s.SaveExchangeState(ctx, "eu", "a", []byte("state-1")); err != nil {
		t.Fatalf("holder saves: %v", err)
	}
	if err := s.SaveExchangeState(ctx, "eu", "b", []byte("state-b")); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("non-holder saves: got %v, want ErrNotHolder", err)
	}
	load("eu", []byte("state-1"))
	load("us", nil)

	// A lapsed lease: another replica takes it, the old holder's writes fail.
	expire()
	acquire("eu", "b", HoldTaken)
	if err := s.SaveExchangeState(ctx, "eu", "a", []byte("late")); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("old holder saves after losing the lease: got %v, want ErrNotHolder", err)
	}
	load("eu", []byte("state-1"))
	if err := s.SaveExchangeState(ctx, "eu", "b", []byte("state-2")); err != nil {
		t.Fatal(err)
	}
	load("eu", []byte("state-2"))

	// Release by a non-holder does nothing; by the holder frees the lease.
	if err := s.ReleaseExchange(ctx, "eu", "a"); err != nil {
		t.Fatal(err)
	}
	acquire("eu", "a", HoldNone)
	if err := s.ReleaseExchange(ctx, "eu", "b"); err != nil {
		t.Fatal(err)
	}
	acquire("eu", "a", HoldTaken)
	load("eu", []byte("state-2")) // the state outlives leases

	for name, err := range map[string]error{
		"empty region": func() error { _, err := s.AcquireExchange(ctx, "", "a", ttl); return err }(),
		"empty holder": func() error { _, err := s.AcquireExchange(ctx, "eu", "", ttl); return err }(),
		"zero ttl":     func() error { _, err := s.AcquireExchange(ctx, "eu", "a", 0); return err }(),
		"save empty":   s.SaveExchangeState(ctx, "", "a", nil),
		"load empty":   func() error { _, err := s.LoadExchangeState(ctx, ""); return err }(),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
}

func TestMemoryExchangeContract(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	m := NewMemoryExchange(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	const ttl = 3 * time.Second
	runExchangeContract(t, m, ttl, func() {
		mu.Lock()
		now = now.Add(ttl)
		mu.Unlock()
	})
}

func TestRedisExchangeContract(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.exchangeKey("e{u}", "lease"), s.cfg.Prefix+"exchange:{e%7Bu%7D}:lease"; got != want {
		t.Errorf("got lease key %q, want %q", got, want)
	}
	const ttl = 100 * time.Millisecond
	runExchangeContract(t, s, ttl, func() {
		// Redis times the lease by its own clock: poll until it lapsed.
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, err := client.Exists(context.Background(), s.exchangeKey("eu", "lease")).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("lease did not lapse within 5s")
			}
			time.Sleep(10 * time.Millisecond) // polling interval, not a wait for an event
		}
	})
}

// TestDeleteShares checks that deleting an applied share puts the bucket
// back on its initial share, on both stores.
func TestDeleteShares(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	rs, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	type store interface {
		SetShares(ctx context.Context, ups []ShareUpdate) error
		Shares(ctx context.Context, keys []string, out []int64) error
		DeleteShares(ctx context.Context, keys []string) error
	}
	for name, s := range map[string]store{"memory": NewMemoryStore(MemoryConfig{}), "redis": rs} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := Limit{Rate: 100, Burst: 100, Cost: 1, InitialShare: 300_000}
			if err := s.SetShares(ctx, []ShareUpdate{{Key: "r/a", SharePPM: 500_000, Limit: l}, {Key: "r/b", SharePPM: 200_000, Limit: l}}); err != nil {
				t.Fatal(err)
			}
			if err := s.DeleteShares(ctx, []string{"r/a", "r/never"}); err != nil {
				t.Fatal(err)
			}
			got := make([]int64, 3)
			if err := s.Shares(ctx, []string{"r/a", "r/b", "r/never"}, got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]int64{-1, 200_000, -1}, got); diff != "" {
				t.Errorf("shares after delete (-want +got):\n%s", diff)
			}
			if err := s.DeleteShares(ctx, []string{""}); !errors.Is(err, ErrInvalid) {
				t.Errorf("empty key: got %v, want ErrInvalid", err)
			}
		})
	}
}
