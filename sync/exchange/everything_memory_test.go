package exchange

import (
	"context"
	"math/bits"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

// TestRedisEverythingPerKey is issue 12's one figure: everything ration
// keeps in Redis for an active key of a global rule, measured with INFO
// memory on a redis-server of its own. 100,000 keys are granted, given a
// share with escrowed tokens by the lease store, and the exchange's state
// for them is saved whole by RedisCoordinator, in each of the store's
// layouts: a Redis key a key (the default) and groups of about 100 keys
// (LayoutGroups with RedisConfig.Groups sized for them). Issue 12 asks for
// about 150 B (≤ 157.5, 5% over): the grouped layout is bounded there; the
// default layout is logged and bounded where it is.
func TestRedisEverythingPerKey(t *testing.T) {
	// 100,000 keys even with -short: the figure is bounded per key at
	// scale, and at 10,000 the groups' and dicts' fixed costs add some 50 B
	// a key (187 B; -short failed here).
	n := 100_000
	srv := redistest.StartServer(t) // its own: FLUSHALL and INFO need the server alone
	client, err := lease.NewRedisClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	snap := steadySnapshot(n)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = snap.Keys[i].Key
	}
	st := SavedState{Whole: true, Keys: keys}
	if st.Head, st.Records, err = codec.EncodeSnapshotParts(&snap); err != nil {
		t.Fatal(err)
	}
	// 60 a minute per user: the bucket expires 2 minutes after its last
	// grant, well after the test.
	l := lease.Limit{Rate: 1, Burst: 60, Cost: 1, InitialShare: region.PPM}
	sized := 1 << bits.Len(uint((n+99)/100-1))
	for _, c := range []struct {
		name  string
		cfg   lease.RedisConfig
		bound float64
	}{
		{"layout=keys", lease.RedisConfig{Timeout: time.Minute}, 250},
		{"layout=groups", lease.RedisConfig{Timeout: time.Minute, Layout: lease.LayoutGroups, Groups: sized}, 157.5},
	} {
		if err := client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		s, err := lease.NewRedisStore(client, c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		coord := NewRedisCoordinator(s)
		if _, err := coord.Acquire(ctx, "eu", "a", time.Hour); err != nil {
			t.Fatal(err)
		}
		// The script loaded and the server's lazily made structures made
		// before the first reading: they would count.
		warm := keys[:1]
		if err := s.Grant(ctx, []lease.GrantRequest{{Key: warm[0], Want: 3, Limit: l}}, make([]lease.Grant, 1)); err != nil {
			t.Fatal(err)
		}
		if err := client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := coord.Acquire(ctx, "eu", "a", time.Hour); err != nil {
			t.Fatal(err)
		}
		before := stateUsedMemory(t, client)
		for i := 0; i < n; i += 500 {
			batch := keys[i:min(i+500, n)]
			grants := make([]lease.GrantRequest, len(batch))
			ups := make([]lease.ShareUpdate, len(batch))
			for j, k := range batch {
				grants[j] = lease.GrantRequest{Key: k, Want: 3, Limit: l}
				ups[j] = lease.ShareUpdate{Key: k, SharePPM: 500_000, Limit: l, Gen: 7, Received: 12_345}
			}
			if err := s.Grant(ctx, grants, make([]lease.Grant, len(batch))); err != nil {
				t.Fatal(err)
			}
			if err := s.SetShares(ctx, ups, nil); err != nil {
				t.Fatal(err)
			}
		}
		buckets := stateUsedMemory(t, client)
		if err := coord.Save(ctx, "eu", "a", st); err != nil {
			t.Fatal(err)
		}
		after := stateUsedMemory(t, client)
		perKey := float64(after-before) / float64(n)
		t.Logf("%-14s %6.1f B per key (%d keys): the key's bucket, share and escrow %.1f B, its exchange record %.1f B",
			c.name, perKey, n, float64(buckets-before)/float64(n), float64(after-buckets)/float64(n))
		if perKey > c.bound {
			t.Errorf("%s: %.1f B per key counting everything, want ≤ %.1f", c.name, perKey, c.bound)
		}
	}
}
