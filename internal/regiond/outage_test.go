package regiond

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/redistest"
)

// TestRedisOutageFailsFastAndRecovers stops the region's redis-server
// mid-test: lease calls fail with Unavailable within the store deadline
// (plus scheduling slack), /readyz turns 503, and both recover by
// themselves once Redis is back.
func TestRedisOutageFailsFastAndRecovers(t *testing.T) {
	srv := redistest.StartServer(t)
	const deadline = 50 * time.Millisecond
	d := startDaemon(t, Config{RedisURL: srv.URL(), StoreTimeout: deadline})
	c := client(t, d)
	ctx := context.Background()
	admin := "http://" + d.AdminAddr()

	// The first call dials Redis and loads the script; on a loaded CI
	// machine that can take longer than the deadline, which is the point
	// of a deadline, so wait for the region to serve before the outage.
	waitFor(t, func() bool {
		_, err := leaseOne(ctx, c, "per-tenant", "tenant=acme", 10)
		return err == nil
	})

	for _, stop := range []struct {
		name string
		stop func()
		back func()
	}{
		{"killed", srv.Stop, srv.Restart},
		{"frozen", srv.Pause, srv.Resume},
	} {
		t.Run(stop.name, func(t *testing.T) {
			stop.stop()
			for i := 0; i < 5; i++ {
				start := time.Now()
				_, err := leaseOne(ctx, c, "per-tenant", "tenant=acme", 10)
				took := time.Since(start)
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("call %d during the outage: got %v, want Unavailable", i, err)
				}
				// The deadline plus generous slack for a loaded 2-core CI
				// machine and the race detector; a hang would take seconds.
				if took > deadline+250*time.Millisecond {
					t.Fatalf("call %d took %v, want about the %v deadline", i, took, deadline)
				}
			}
			if code, _ := get(t, admin+"/readyz"); code != 503 {
				t.Fatalf("/readyz during the outage: got %d, want 503", code)
			}
			stop.back()
			waitFor(t, func() bool {
				_, err := leaseOne(ctx, c, "per-tenant", "tenant=acme", 1)
				return err == nil
			})
			// A pooled connection may still time out once after the
			// server comes back; readiness must return by itself.
			waitFor(t, func() bool {
				code, _ := get(t, admin+"/readyz")
				return code == 200
			})
		})
	}
}
