package faults

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/redistest"
)

// TestFaultRedisFailover: eu's store is a primary and a replica under
// three sentinels; the replica is cut off from the primary's stream while
// eu keeps writing, then the primary is killed (SIGKILL) and Sentinel
// promotes the replica, which lacks those writes (asynchronous
// replication's lag). eu's regiond follows the new master without a
// restart.
func TestFaultRedisFailover(t *testing.T) {
	needFaults(t)
	st := redistest.StartSentinel(t)
	w := newWorld(t, map[string]string{"eu": st.URL()}, nil)
	w.startRegions()
	w.steady()

	st.CutReplication(t)
	cutAt := redistest.ReplOffset(t, st.Primary)
	waitUntil(t, 10*time.Second, "eu writes to the cut-off primary", func() bool {
		return redistest.ReplOffset(t, st.Primary) > cutAt+2048
	})
	began := time.Now()
	last := redistest.ReplOffset(t, st.Primary)
	st.Primary.Stop()
	t.Logf("the replica lacks at least %d bytes of the primary's stream", last-redistest.ReplOffset(t, st.Replica))
	promoted := st.WaitPromoted(t, 15*time.Second)
	t.Logf("the sentinels promoted the replica %v after the kill", promoted)
	w.row("redis-failover", began, began)
}

// TestFaultRedisRestart: eu's redis-server is killed and started again at
// once with nothing persisted: its buckets, its applied share and its
// exchange state are gone.
func TestFaultRedisRestart(t *testing.T) {
	needFaults(t)
	w := newWorld(t, nil, nil)
	w.startRegions()
	w.steady()
	began := time.Now()
	w.servers["eu"].Restart()
	w.row("redis-restart", began, began)
}

// redisPause is how long TestFaultRedisPause freezes a Redis: 15 agent
// deadlines, 12 store timeouts, 6 sync periods (twice the exchange's
// holder lease).
const redisPause = 3 * time.Second

// TestFaultRedisPause: eu's Redis answers nothing for redisPause (CLIENT
// PAUSE ALL: every client's commands wait, as behind a long DEBUG SLEEP or
// a stalled host), far longer than the agents' deadline and regiond's
// store timeout; the agents decide by the rule's failure mode (local)
// meanwhile.
func TestFaultRedisPause(t *testing.T) {
	needFaults(t)
	w := newWorld(t, nil, nil)
	w.startRegions()
	w.steady()
	c := redis.NewClient(&redis.Options{Addr: w.servers["eu"].Addr()})
	defer c.Close()
	began := time.Now()
	if err := c.Do(context.Background(), "CLIENT", "PAUSE", redisPause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	ended := began.Add(redisPause)
	w.run(time.Until(ended))
	w.row("redis-pause", began, ended)
}
