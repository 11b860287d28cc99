package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/exchange"
)

// TestReadRedisCountsEntries writes keys with the real writers (lease's
// RedisStore in each layout, the exchange's RedisCoordinator) and checks
// that readRedis counts each key once, whether it is a Redis key or a
// field of a group hash, and the exchange's records and keys apart.
func TestReadRedisCountsEntries(t *testing.T) {
	needRedis(t)
	srv := redistest.StartServer(t)
	client, err := lease.NewRedisClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const n = 2_000
	keys := make([]string, n)
	grants := make([]lease.GrantRequest, n)
	records := make([][]byte, n)
	l := lease.Limit{Rate: 1, Burst: 60, Cost: 1, InitialShare: region.PPM}
	for i := range keys {
		keys[i] = fmt.Sprintf("per-user/u%d", i)
		grants[i] = lease.GrantRequest{Key: keys[i], Want: 1, Limit: l}
		records[i] = []byte("record")
	}
	for _, c := range []struct {
		cfg        lease.RedisConfig
		own, field int64
	}{
		{lease.RedisConfig{Timeout: time.Minute}, n, 0},
		{lease.RedisConfig{Timeout: time.Minute, Layout: lease.LayoutGroups, Groups: groupsFor(n)}, 0, n},
	} {
		t.Run(c.cfg.Layout.String(), func(t *testing.T) {
			if err := client.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			s, err := lease.NewRedisStore(client, c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Grant(ctx, grants, make([]lease.Grant, n)); err != nil {
				t.Fatal(err)
			}
			coord := exchange.NewRedisCoordinator(s)
			if _, err := coord.Acquire(ctx, "eu", "a", time.Hour); err != nil {
				t.Fatal(err)
			}
			st := exchange.SavedState{Whole: true, Head: []byte("head"), Keys: keys, Records: records}
			if err := coord.Save(ctx, "eu", "a", st); err != nil {
				t.Fatal(err)
			}
			m, err := readRedis(ctx, client, "eu")
			if err != nil {
				t.Fatal(err)
			}
			if m.own != c.own || m.fields != c.field || m.entries() != n {
				t.Errorf("got %d own keys and %d fields (%d entries), want %d and %d", m.own, m.fields, m.entries(), c.own, c.field)
			}
			if m.xrecords != n || m.xkeys < 3 || m.xbytes <= int64(n)*6 {
				t.Errorf("got %d exchange records in %d keys of %d B, want %d records in the hold, the head and its groups, above %d B", m.xrecords, m.xkeys, m.xbytes, n, n*6)
			}
			if want := m.own + m.groups + m.xkeys; m.dbsize != want {
				t.Errorf("DBSIZE %d, want own keys + groups + the exchange's = %d", m.dbsize, want)
			}
			if (c.cfg.Layout == lease.LayoutGroups) != (m.groups > 0) {
				t.Errorf("got %d group hashes in layout %v", m.groups, c.cfg.Layout)
			}
		})
	}
}

func TestGroupsForIsNearestPowerOfTwo(t *testing.T) {
	for _, c := range []struct{ keys, want int }{
		{1, 1}, {64, 1}, {100, 2}, {5_000, 64}, {100_000, 2048}, {1_000_000, 16384}, {10_000_000, 131072},
	} {
		if got := groupsFor(c.keys); got != c.want {
			t.Errorf("groupsFor(%d) = %d, want %d", c.keys, got, c.want)
		}
	}
}
