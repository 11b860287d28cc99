package redistest

import (
	"strings"
	"testing"
	"time"
)

// TestSentinelFailover: the sentinels name the primary, and once it is
// killed they promote the replica within a few seconds.
func TestSentinelFailover(t *testing.T) {
	s := StartSentinel(t)
	if got, want := s.MasterAddr(), s.Primary.Addr(); got != want {
		t.Fatalf("got master %q, want the primary %q", got, want)
	}
	if got := s.URL(); !strings.HasPrefix(got, "redis-sentinel://127.0.0.1:") || !strings.HasSuffix(got, "/"+SentinelMaster) || strings.Count(got, ",") != 2 {
		t.Errorf("got URL %q, want redis-sentinel:// with three sentinels and /%s", got, SentinelMaster)
	}
	primary, replica := RunID(t, s.Primary), RunID(t, s.Replica)
	if primary == replica || primary == "" {
		t.Fatalf("primary and replica run_ids %q and %q, want two distinct ones", primary, replica)
	}
	s.Primary.Stop()
	took := s.WaitPromoted(t, 20*time.Second)
	t.Logf("replica promoted %v after the primary was killed", took)
	if got := RunID(t, s.Replica); got != replica {
		t.Errorf("promotion changed the replica's run_id from %q to %q", replica, got)
	}
}
