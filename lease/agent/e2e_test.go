package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/internal/regiond"
	"github.com/ration-dev/ration/lease"
)

// startRegiond runs the whole regiond in-process on a Redis at redisURL,
// serving policy doc, and stops it at cleanup.
func startRegiond(t *testing.T, redisURL, doc string) *regiond.Daemon {
	t.Helper()
	return startRegiondWith(t, redisURL, doc, nil, 0)
}

// startRegiondWith is startRegiond with its metrics on reg (nil: a registry
// of its own) and its store calls bounded by storeTimeout (0: regiond's
// default).
func startRegiondWith(t *testing.T, redisURL, doc string, reg *prometheus.Registry, storeTimeout time.Duration) *regiond.Daemon {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := regiond.New(regiond.Config{
		Region: "eu", Listen: "127.0.0.1:0", Admin: "-", RedisURL: redisURL,
		PolicyFile: path, Logger: quietLogger(), Registry: reg, StoreTimeout: storeTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("regiond Shutdown: %v", err)
		}
	})
	return d
}

// keyNames makes tenant names unique to this run, so that tests sharing a
// Redis (RATION_REDIS_URL) never meet each other's buckets.
func keyNames(t *testing.T, names ...string) []string {
	p := strings.NewReplacer(":", "-", "/", "-").Replace(redistest.KeyPrefix(t))
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p + n
	}
	return out
}

// TestEndToEndRegiondOnRedis: regiond on a real redis-server, three agents
// with four goroutines each on two shared keys at twice their limit, then
// two agents at 1,000 requests/s on a key under its limit for the store
// operations per admitted request at steady state.
func TestEndToEndRegiondOnRedis(t *testing.T) {
	url := redistest.Start(t)
	d := startRegiond(t, url, loadPolicy+`
  - name: roomy
    key: [user]
    limit: 100000
    period: 1s
`)
	t.Run("overload", func(t *testing.T) {
		spec := loadSpec{
			keys: keyNames(t, "acme", "globex"), agents: 3, goroutines: 4, perAgent: 1000,
			duration: 2500 * time.Millisecond, window: 1500 * time.Millisecond,
			cfg: testConfig(),
		}
		res := runLoad(t, d.LeaseAddr(), spec)
		checkBoundAndUtilisation(t, spec, res, 1500, 1500)
	})
	t.Run("steady", func(t *testing.T) {
		spec := loadSpec{
			keys: keyNames(t, "steady"), agents: 2, goroutines: 2, perAgent: 1000,
			duration: 2 * time.Second, window: time.Second, cfg: testConfig(),
		}
		// Count the scripts Redis itself ran, when the server is this
		// test's alone (a shared RATION_REDIS_URL serves other tests too).
		if os.Getenv(redistest.EnvURL) == "" {
			spec.storeOps = redisScriptCalls(t, url)
		}
		// The roomy rule keys on user; send both descriptors so that only
		// it matches (per-tenant needs tenant).
		res := runLoadOn(t, d.LeaseAddr(), spec, "user")
		opsPer := float64(res.winOps) / float64(max(res.winAdmittedAll, 1))
		t.Logf("%v; window: %d Redis script calls for %d admitted = %.4f per admitted request", res.perKey[0], res.winOps, res.winAdmittedAll, opsPer)
		if opsPer > 0.025 && !raceEnabled {
			t.Errorf("%.4f Redis ops per admitted request at steady state, want at most 0.02 (0.025 allowed for timing noise)", opsPer)
		}
	})
}

// TestFaultRedisStops: the region's Redis dies (SIGKILL) mid-run and comes
// back empty on the same port.
func TestFaultRedisStops(t *testing.T) {
	srv := redistest.StartServer(t)
	d := startRegiond(t, srv.URL(), faultPolicy)
	runFaultScenario(t, d.LeaseAddr(), srv.Stop, srv.Restart)
}

// redisScriptCalls returns a counter of the allocator scripts the Redis at
// url has run (EVALSHA and EVAL calls in INFO commandstats): one per key of
// every grant and return, the store operations the target is about. (The
// script's own commands inside count once with it.)
func redisScriptCalls(t *testing.T, url string) func() int64 {
	t.Helper()
	c, err := lease.NewRedisClient(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return func() int64 {
		info, err := c.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Errorf("redis INFO: %v", err)
			return 0
		}
		var n int64
		for _, line := range strings.Split(info, "\n") {
			line = strings.TrimSpace(line)
			for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
				if v, ok := strings.CutPrefix(line, cmd); ok {
					v, _, _ = strings.Cut(v, ",")
					calls, err := strconv.ParseInt(v, 10, 64)
					if err != nil {
						t.Errorf("redis INFO %q: %v", line, err)
					}
					n += calls
				}
			}
		}
		return n
	}
}
