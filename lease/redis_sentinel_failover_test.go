package lease

import (
	"errors"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/redistest"
)

// TestRedisStoreFollowsSentinelFailover runs a store on a Redis under
// Sentinel and kills the primary: calls fail with ErrUnavailable while no
// master answers, then succeed on the promoted replica through the same
// client, and Incarnation changes from the primary's run_id to the
// replica's. run_id is a process's own and is not replicated, so a
// promotion always changes the incarnation, whether or not the replica
// missed writes.
func TestRedisStoreFollowsSentinelFailover(t *testing.T) {
	st := redistest.StartSentinel(t)
	client, err := NewRedisClient(st.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reqs := []GrantRequest{{Key: "a", Want: 1, Limit: slow(1000, 1)}}
	out := make([]Grant, 1)
	if err := s.Grant(t.Context(), reqs, out); err != nil {
		t.Fatalf("Grant before the failover: %v", err)
	}
	before, err := s.Incarnation(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := redistest.RunID(t, st.Primary); before != want {
		t.Fatalf("incarnation %q before the failover, want the primary's run_id %q", before, want)
	}
	replica := redistest.RunID(t, st.Replica)

	st.Primary.Stop()
	killed := time.Now()
	var failed int
	for {
		err := s.Grant(t.Context(), reqs, out)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Grant during the failover: got %v, want ErrUnavailable", err)
		}
		failed++
		if time.Since(killed) > 20*time.Second {
			t.Fatalf("Grant still failing %v after the primary was killed: %v", time.Since(killed), err)
		}
		time.Sleep(20 * time.Millisecond) // a caller's retry interval, not a wait for an event
	}
	t.Logf("the store served again %v after the primary was killed (%d calls failed)", time.Since(killed), failed)
	after, err := s.Incarnation(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if after != replica || after == before {
		t.Errorf("incarnation after the failover: got %q, want the replica's run_id %q (was %q)", after, replica, before)
	}
}
