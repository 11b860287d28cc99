package lease

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// A store that loses writes (a Redis failover to a replica that had not
// caught up, a restart without persistence) also loses the applied shares
// written in that window. A share the exchange had lowered (a gift) then
// comes back raised, and nothing rewrites it while the exchange's own view
// of the key does not change: the region would run on share it gave away,
// and the shares of the key would sum to more than PPM for as long as that
// lasts. Incarnation lets the exchange notice such a loss and write every
// share again (region.State.ResyncAll).

// Incarnation identifies the life of the Redis servers behind the store:
// the run_id of every master (sorted, comma-separated for a cluster). It
// changes when a server restarts or a replica takes over, the events that
// can lose writes; it also changes on events that lose none (a planned
// failover, a resharding), which only costs one rewrite of every share.
func (s *RedisStore) Incarnation(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	c, ok := s.client.(*redis.ClusterClient)
	if !ok {
		id, err := runID(ctx, s.client)
		if err != nil {
			return "", s.fail("incarnation", err)
		}
		return id, nil
	}
	var (
		mu  sync.Mutex
		ids []string
	)
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		id, err := runID(ctx, m)
		if err == nil {
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		return "", s.fail("incarnation", err)
	}
	slices.Sort(ids)
	return strings.Join(ids, ","), nil
}

// runID reads the run_id line of INFO server.
func runID(ctx context.Context, c redis.Cmdable) (string, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok && v != "" {
			return v, nil
		}
	}
	return "", errors.New("INFO server has no run_id")
}

// Incarnation identifies the store's life: it changes at every Restore,
// the memory store's model of lost writes. It never fails.
func (m *MemoryStore) Incarnation(context.Context) (string, error) {
	return "memory/" + strconv.FormatUint(m.restores.Load(), 10), nil
}
