package kvstore

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/ration-dev/ration/sync/embedded"
)

var seedFlag = flag.Uint64("kvstore.seed", 0, "seed for the randomised tests (0: pick one from the clock)")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newRand returns a generator for a randomised test and logs its seed.
func newRand(t testing.TB) *rand.Rand {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -kvstore.seed=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// quiet discards logs.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testCtx is a context bounded by a deadline for one test.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startServer starts an embedded JetStream server on loopback.
func startServer(t *testing.T, cfg embedded.Config) *embedded.Server {
	t.Helper()
	cfg.JetStream = true
	s, err := embedded.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// connect connects to url; the connection reconnects forever, quickly.
func connect(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(10 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// open opens the store of a fresh server (or of nc, if given).
func open(t *testing.T, ctx context.Context, nc *nats.Conn) *Store {
	t.Helper()
	if nc == nil {
		nc = connect(t, startServer(t, embedded.Config{}).ClientURL())
	}
	st, err := Open(ctx, Config{Conn: nc, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// doc is a valid policy of one rule with the given limit.
func doc(limit int) []byte {
	return []byte("rules:\n  - name: per-tenant\n    key: [tenant]\n    limit: " + strconv.Itoa(limit) + "\n    period: 1s\n")
}

// waitFor polls cond until it holds or the deadline passes, returning
// whether it held. It waits on ch (a notification) between polls, or a
// short tick for conditions without one.
func waitFor(t *testing.T, ch <-chan struct{}, cond func() bool) bool {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ch:
		case <-tick.C:
		case <-deadline.C:
			return false
		}
	}
	return true
}
