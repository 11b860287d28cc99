package faults

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/internal/regiond"
	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/embedded"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-redis keeps a pool reaper per client until Close; the daemon
		// closes its client, but the reaper exits asynchronously.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"))
}

// The one global rule every fault runs under: the example policy's
// per-tenant rule, L = 1,000 tokens/s and b = 2,000, on_error local (the
// default).
const (
	limit      = 1000.0 // L, tokens/s
	burst      = 2000.0 // b
	policyYAML = `rules:
  - name: per-tenant
    key: [tenant]
    limit: 1000
    period: 1s
    burst: 2000
`
	// leaseTTL is τ, regiond's default; B = b + L·τ.
	leaseTTL = 100 * time.Millisecond
	// syncPeriod is the exchange's epoch. A fault lasts several of them
	// (and many agent deadlines), so the matrix runs faults of seconds
	// where production would see tens of seconds.
	syncPeriod = 500 * time.Millisecond
	// agentDeadline is the agents' RoundTripTimeout and RefreshTimeout.
	agentDeadline = 200 * time.Millisecond
	// storeTimeout bounds regiond's store calls: above a loaded machine's
	// hiccups, below a paused Redis.
	storeTimeout = 250 * time.Millisecond
)

// allowance is the project's bound for a window of length w:
// L·W + B with B = b + L·τ (docs/DESIGN.md, "The bound").
func allowance(w time.Duration) float64 {
	return limit*w.Seconds() + burst + limit*leaseTTL.Seconds()
}

var (
	regions = []string{"ap", "eu", "us"}
	// rates is the steady skewed demand, requests/s of cost 1 per region:
	// 1.5 L in all, eu hungrier than its share.
	rates  = map[string]int64{"ap": 200, "eu": 900, "us": 400}
	tenant = []policy.Descriptor{{Key: "tenant", Value: "acme"}}
	key    = policy.StoreKey("per-tenant", "tenant=acme")
)

// targets are the max-min targets of rates (region's own computation,
// with its default floor).
func targets() map[string]int64 {
	need := make([]float64, len(regions))
	for i, r := range regions {
		need[i] = float64(rates[r]) / limit * region.PPM
	}
	st, err := region.New(region.Config{Self: regions[0], Regions: regions})
	if err != nil {
		panic(err)
	}
	t := region.Targets(region.PPM, need, st.Config().FloorPPM, nil)
	m := map[string]int64{}
	for i, r := range regions {
		m[r] = t[i]
	}
	return m
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// needFaults skips the matrix unless RATION_FAULTS=1 (make faults).
func needFaults(t *testing.T) {
	t.Helper()
	if os.Getenv("RATION_FAULTS") != "1" {
		t.Skip("the fault matrix runs with RATION_FAULTS=1 (make faults)")
	}
}

// world is one deployment under test: three regions, their stores, their
// regiond daemons and one gateway agent per region under load.
type world struct {
	t       *testing.T
	redis   map[string]string            // by region: its Redis URL
	servers map[string]*redistest.Server // by region, when the world started it
	nats    map[string]string            // by region: the NATS its regiond uses
	daemons map[string][]*regiond.Daemon // in-process replicas, by region
	// share reads a region's applied share from its store; set for every
	// region (in-process daemons get one by default).
	share map[string]func(context.Context) (int64, error)
	rec   *recorder
	gws   map[string]*gateway
}

// newWorld starts a redis-server for every region that redis does not
// name, and one embedded NATS server for every region that nats does not.
func newWorld(t *testing.T, redis, nats map[string]string) *world {
	t.Helper()
	w := &world{t: t, redis: map[string]string{}, servers: map[string]*redistest.Server{}, nats: map[string]string{},
		daemons: map[string][]*regiond.Daemon{}, share: map[string]func(context.Context) (int64, error){},
		rec: newRecorder(), gws: map[string]*gateway{}}
	var shared string
	for _, r := range regions {
		if u, ok := redis[r]; ok {
			w.redis[r] = u
		} else {
			w.servers[r] = redistest.StartServer(t)
			w.redis[r] = w.servers[r].URL()
		}
		if u, ok := nats[r]; ok {
			w.nats[r] = u
			continue
		}
		if shared == "" {
			s, err := embedded.Start(embedded.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			shared = s.ClientURL()
		}
		w.nats[r] = shared
	}
	return w
}

// config is the regiond configuration of a replica of r.
func (w *world) config(r, replica string) regiond.Config {
	return regiond.Config{
		Region: r, Regions: regions, Replica: replica,
		Listen: "127.0.0.1:0", Admin: "127.0.0.1:0",
		RedisURL: w.redis[r], NATSURL: w.nats[r], NATSReconnectWait: 20 * time.Millisecond,
		PolicyYAML: []byte(policyYAML), LeaseTTL: leaseTTL, StoreTimeout: storeTimeout,
		SyncPeriod: syncPeriod, DecideAfter: syncPeriod / 10, // loopback: tallies arrive within milliseconds
		Logger: quiet(),
	}
}

// startDaemon starts a replica of r in-process, stopped at cleanup.
func (w *world) startDaemon(r, replica string) *regiond.Daemon {
	w.t.Helper()
	d, err := regiond.New(w.config(r, replica))
	if err != nil {
		w.t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			w.t.Errorf("regiond %s Shutdown: %v", replica, err)
		}
	})
	w.daemons[r] = append(w.daemons[r], d)
	if w.share[r] == nil {
		w.share[r] = func(ctx context.Context) (int64, error) { return d.Share(ctx, key) }
	}
	return d
}

// startRegions starts one in-process replica in every region that has
// none yet, and a gateway on each region's first replica.
func (w *world) startRegions() {
	w.t.Helper()
	for _, r := range regions {
		if len(w.daemons[r]) == 0 && w.share[r] == nil {
			w.startDaemon(r, r+"-0")
		}
	}
	for _, r := range regions {
		if w.gws[r] == nil {
			w.gws[r] = w.startGateway(r, agent.Config{Target: w.daemons[r][0].LeaseAddr()})
		}
	}
}

// shares reads every region's share; ok is false if a read failed.
func (w *world) shares() (map[string]int64, bool) {
	m := map[string]int64{}
	for _, r := range regions {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		v, err := w.share[r](ctx)
		cancel()
		if err != nil {
			return nil, false
		}
		m[r] = v
	}
	return m, true
}

// converged reports whether every share is within ±5% of the quota of its
// target (region's property test's tolerance) and never sums above 1.
func (w *world) converged() bool {
	sh, ok := w.shares()
	if !ok {
		return false
	}
	want := targets()
	var sum int64
	for _, r := range regions {
		sum += sh[r]
		if d := sh[r] - want[r]; d < -50_000 || d > 50_000 {
			return false
		}
	}
	return sum <= region.PPM
}

// waitUntil polls cond until it holds, failing the test after within.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not a wait for an event
	}
	return time.Since(start)
}

// steady starts the load and waits until the shares converged on their
// targets and the fleet admits what the rule allows; it returns when.
func (w *world) steady() {
	w.t.Helper()
	waitUntil(w.t, 30*time.Second, "the shares reach their targets and the fleet admits at L", w.healthy)
	// A stretch of steady state before the fault, for the windows.
	w.run(2 * time.Second)
}

// run lets the deployment run for d: a phase of the scenario.
func (w *world) run(d time.Duration) { <-time.After(d) }

// recoverySpan is the stretch over which recovery is judged.
const recoverySpan = 500 * time.Millisecond

// healthy reports whether the deployment is as the fault found it: the
// fleet admitted at least 90% of L over the recoverySpan before now
// (demand is 1.5 L) and every share is within 5% of its target.
func (w *world) healthy() bool {
	now := time.Now()
	return float64(w.rec.admitted(now.Add(-recoverySpan), now)) >= 0.9*limit*recoverySpan.Seconds() && w.converged()
}

// row measures a fault that began at began and ended at ended (a heal, a
// restart, or, for a kill, the kill itself). Its recovery time runs from
// ended to the start of the first recoverySpan, wholly after ended, at
// whose end the deployment is healthy. Once recovered it runs on for a
// window's length, then logs and checks the row: the worst ratio
// admitted ÷ (L·W + B) of the windows of 1 s and 10 s that meet [began,
// recovery].
func (w *world) row(name string, began, ended time.Time) {
	w.t.Helper()
	w.run(time.Until(ended.Add(recoverySpan)))
	waitUntil(w.t, 60*time.Second, name+": recovery", w.healthy)
	rec := time.Now().Add(-recoverySpan)
	recovery := max(rec.Sub(ended), 0)
	w.run(ratioWindows[len(ratioWindows)-1] + time.Second)
	ratio, win, at := w.rec.worst(began, rec, time.Now())
	w.t.Logf("worst window: %v from %v after the fault began (%d admitted, L·W + B = %.0f)",
		win, at.Sub(began).Round(time.Millisecond), w.rec.admitted(at, at.Add(win)), allowance(win))
	w.t.Logf("fault=%s ratio=%.3f recovery=%v", name, ratio, recovery.Round(10*time.Millisecond))
	if ratio > 1 {
		w.t.Errorf("%s: a window admitted %.3f × (L·W + B), want at most 1", name, ratio)
	}
}

// recorder counts admitted tokens in 10ms slots from its start.
type recorder struct {
	start time.Time
	slots []atomic.Int64
}

const slot = 10 * time.Millisecond

// ratioWindows are the window lengths W the ratio is checked over (the
// design's 1 s and 10 s; 60 s windows would need minutes per fault).
var ratioWindows = []time.Duration{time.Second, 10 * time.Second}

func newRecorder() *recorder {
	return &recorder{start: time.Now(), slots: make([]atomic.Int64, int(10*time.Minute/slot))}
}

func (r *recorder) index(at time.Time) int {
	return min(max(int(at.Sub(r.start)/slot), 0), len(r.slots)-1)
}

func (r *recorder) add(at time.Time, n int64) { r.slots[r.index(at)].Add(n) }

// admitted is what was admitted in [from, to), to the slot.
func (r *recorder) admitted(from, to time.Time) int64 {
	var n int64
	for i := r.index(from); i < r.index(to); i++ {
		n += r.slots[i].Load()
	}
	return n
}

// worst returns the highest admitted ÷ (L·W + B) of the windows of every
// length in ratioWindows that lie within the recording until end and meet
// [from, to], with that window's length and start.
func (r *recorder) worst(from, to, end time.Time) (ratio float64, w time.Duration, at time.Time) {
	return r.worstUntil(from, to, r.index(end))
}

func (r *recorder) worstUntil(from, to time.Time, end int) (ratio float64, w time.Duration, at time.Time) {
	sum := make([]int64, end+1)
	for i := range end {
		sum[i+1] = sum[i] + r.slots[i].Load()
	}
	for _, win := range ratioWindows {
		n := int(win / slot)
		for s := max(r.index(from)-n, 0); s <= r.index(to) && s+n <= end; s++ {
			if q := float64(sum[s+n]-sum[s]) / allowance(win); q > ratio {
				ratio, w, at = q, win, r.start.Add(time.Duration(s)*slot)
			}
		}
	}
	return ratio, w, at
}

// gateway is one agent under steady load: rates[region] requests/s of
// cost 1 on the global key, in 10ms steps, each admitted one recorded.
type gateway struct {
	region string
	clock  atomic.Int64 // offset added to the agent's clock, ns
	mu     sync.Mutex
	a      *agent.Agent // nil once killed
	stop   chan struct{}
	wg     sync.WaitGroup
}

// startGateway starts an agent with cfg (its Target or Conn set) and its
// load; both end at cleanup.
func (w *world) startGateway(r string, cfg agent.Config) *gateway {
	w.t.Helper()
	g := &gateway{region: r, stop: make(chan struct{})}
	g.a = w.newAgent(g, cfg)
	g.wg.Add(1)
	go g.load(w.rec)
	w.t.Cleanup(func() {
		close(g.stop)
		g.wg.Wait()
		if a := g.agent(); a != nil {
			_ = a.Close()
		}
	})
	return g
}

// newAgent starts an agent for g whose clock is g's offset from real time.
func (w *world) newAgent(g *gateway, cfg agent.Config) *agent.Agent {
	w.t.Helper()
	cfg.Logger = quiet()
	if cfg.AgentID == "" {
		cfg.AgentID = "gateway-" + g.region
	}
	cfg.RoundTripTimeout, cfg.RefreshTimeout = agentDeadline, agentDeadline
	cfg.Clock = func() time.Time { return time.Now().Add(time.Duration(g.clock.Load())) }
	a, err := agent.New(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.WaitPolicy(ctx); err != nil {
		_ = a.Close()
		w.t.Fatalf("agent of %s: %v", g.region, err)
	}
	return a
}

func (g *gateway) agent() *agent.Agent {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.a
}

// swap replaces g's agent (nil: none, the gateway admits nothing) and
// returns the old one.
func (g *gateway) swap(a *agent.Agent) *agent.Agent {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.a
	g.a = a
	return old
}

func (g *gateway) load(rec *recorder) {
	defer g.wg.Done()
	tick := time.NewTicker(slot)
	defer tick.Stop()
	rate := float64(rates[g.region])
	last := time.Now()
	var owed float64
	for {
		select {
		case <-g.stop:
			return
		case now := <-tick.C:
			// A slow call (a cold key's round trip) delays the next
			// ones; they are sent then, as a gateway's queue would.
			owed = min(owed+rate*now.Sub(last).Seconds(), rate) // at most a second's backlog
			last = now
			a := g.agent()
			for ; owed >= 1; owed-- {
				if a == nil {
					continue
				}
				if a.Allow(context.Background(), tenant, 1).Allowed {
					rec.add(time.Now(), 1)
				}
			}
		}
	}
}
