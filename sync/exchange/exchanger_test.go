package exchange

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
	"github.com/ration-dev/ration/sync/embedded"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testPolicy = "rules:\n  - name: r\n    key: [tenant]\n    limit: 1000\n    period: 1s\n    burst: 1000\n"

// testKey is the global key the tests drive.
var testKey = policy.StoreKey("r", "tenant=acme")

func startNATS(t *testing.T) string {
	t.Helper()
	s, err := embedded.Start(embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s.ClientURL()
}

func dial(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// replica is one Exchanger of a test region with its registry.
type replica struct {
	x   *Exchanger
	reg *prometheus.Registry
}

// testRegion is a region of memory-store replicas.
type testRegion struct {
	name     string
	store    *lease.MemoryStore
	coord    *MemoryCoordinator
	replicas []*replica
}

type cluster struct {
	t       *testing.T
	url     string
	regions []string
	period  time.Duration
	pol     *policy.Set
	byName  map[string]*testRegion
}

func newCluster(t *testing.T, period time.Duration, regions ...string) *cluster {
	pol, err := policy.Parse("test.yaml", []byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, url: startNATS(t), regions: regions, period: period, pol: pol, byName: map[string]*testRegion{}}
	for _, r := range regions {
		c.byName[r] = &testRegion{name: r, store: lease.NewMemoryStore(lease.MemoryConfig{}), coord: NewMemoryCoordinator(nil)}
	}
	return c
}

// start adds and starts a replica of region r.
func (c *cluster) start(r, name string) *replica {
	c.t.Helper()
	tr := c.byName[r]
	reg := prometheus.NewRegistry()
	x, err := New(Config{
		Region:      r,
		Replica:     name,
		Regions:     c.regions,
		Period:      c.period,
		Conn:        dial(c.t, c.url),
		Store:       tr.store,
		Coordinator: tr.coord,
		Policy:      func() *policy.Set { return c.pol },
		Registerer:  reg,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		c.t.Fatal(err)
	}
	if err := x.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = x.Shutdown(context.Background()) })
	rp := &replica{x: x, reg: reg}
	tr.replicas = append(tr.replicas, rp)
	return rp
}

// share reads region r's applied share of key from its store.
func (c *cluster) share(r, key string) int64 {
	c.t.Helper()
	tr := c.byName[r]
	out := []int64{0}
	if err := tr.store.Shares(context.Background(), []string{key}, out); err != nil {
		c.t.Fatal(err)
	}
	if out[0] < 0 {
		return tr.replicas[0].x.InitialShare(key, nil)
	}
	return out[0]
}

// demand observes rate() tokens/s of demand for key at replica rp(), in
// 5ms steps, until stop is closed. All of it is granted.
func demand(wg *sync.WaitGroup, stop <-chan struct{}, rate func() int64, rp func() *replica) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		var owed float64 // tokens due but not observed yet (fractions)
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				owed += float64(rate()) * now.Sub(last).Seconds()
				last = now
				if d := int64(owed); d > 0 {
					owed -= float64(d)
					rp().x.Observe(testKey, nil, d, d)
				}
			}
		}
	}()
}

// runDemand starts a replica of every region and drives each with its
// tokens/s in rates until the test ends; setRates changes them.
func (c *cluster) runDemand(rates map[string]int64) (reps map[string]*replica, setRates func(map[string]int64)) {
	reps = map[string]*replica{}
	for _, r := range c.regions {
		reps[r] = c.start(r, r+"-0")
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, r := range c.regions {
		demand(&wg, stop, func() int64 { mu.Lock(); defer mu.Unlock(); return rates[r] }, func() *replica { return reps[r] })
	}
	c.t.Cleanup(func() { close(stop); wg.Wait() }) // before the replicas close
	return reps, func(next map[string]int64) { mu.Lock(); rates = next; mu.Unlock() }
}

// waitShares polls until ok holds for the shares of testKey, checking that
// they never sum above PPM, and fails after a deadline.
func (c *cluster) waitShares(what string, within time.Duration, ok func(map[string]int64) bool) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		sh := c.shares(testKey)
		var sum int64
		for _, v := range sh {
			sum += v
		}
		if sum > region.PPM {
			c.t.Fatalf("%s: shares %v sum to %d ppm, more than %d", what, sh, sum, region.PPM)
		}
		if ok(sh) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not reached within %v; shares %v", what, within, sh)
		}
		time.Sleep(c.period / 5) // polling interval, not a wait for an event
	}
}

// shares reads key's share in every region's store at one instant: the
// stores are read one after another, so a read of the giver before its
// lowering and of the receiver after its raise would sum both sides of a
// gift that never coexisted. It reads them all twice and retries until both
// passes agree (as regiond's end-to-end tests do).
func (c *cluster) shares(key string) map[string]int64 {
	c.t.Helper()
	read := func() map[string]int64 {
		sh := map[string]int64{}
		for _, r := range c.regions {
			sh[r] = c.share(r, key)
		}
		return sh
	}
	for i := 0; ; i++ {
		a, b := read(), read()
		if maps.Equal(a, b) {
			return a
		}
		if i == 100 {
			c.t.Fatalf("shares never stood still: %v then %v", a, b)
		}
	}
}

func near(got, want int64) bool { return got >= want-50_000 && got <= want+50_000 }

// TestShareFollowsDemand runs three regions on memory stores over an
// embedded NATS server: demand concentrated in eu pulls share there, then
// moves to us and the share follows.
func TestShareFollowsDemand(t *testing.T) {
	c := newCluster(t, 50*time.Millisecond, "ap", "eu", "us")
	reps, setRates := c.runDemand(map[string]int64{"eu": 900, "us": 100})

	// Needs 0, 0.1, 0.9 of L; floors of 0.5% (region's default).
	target := region.Targets(region.PPM, []float64{0, 900_000, 100_000}, 5_000, nil)
	c.waitShares("eu takes the share", 10*time.Second, func(sh map[string]int64) bool {
		return near(sh["ap"], target[0]) && near(sh["eu"], target[1]) && near(sh["us"], target[2])
	})

	setRates(map[string]int64{"eu": 100, "us": 900})
	c.waitShares("us takes the share", 10*time.Second, func(sh map[string]int64) bool {
		return near(sh["eu"], target[2]) && near(sh["us"], target[1])
	})

	want := []string{
		`ration_exchange_leader 1`,
		`ration_exchange_share_ppm{key="r/tenant=acme",region="eu"}`,
		`ration_exchange_share_ppm{key="r/tenant=acme",region="us"}`,
		`ration_exchange_report_age_seconds{region="us"}`,
		`ration_exchange_epochs_total{role="holder"}`,
		`ration_exchange_transfers_ppm_total{direction="given"}`,
		`ration_exchange_dropped_total{reason="corrupt"} 0`,
		// Every peer heard reads the newest version: eu writes it.
		"ration_exchange_wire_version " + strconv.Itoa(int(codec.Latest)),
	}
	// The share gauges are set at eu's epochs from the reports it heard:
	// the shares can reach their targets an epoch before eu's next one.
	body := waitMetrics(t, reps["eu"].reg, 5*time.Second, c.period/5, want...)
	if strings.Contains(body, `ration_exchange_transfers_ppm_total{direction="given"} 0`+"\n") {
		t.Errorf("eu gave no share, want some")
	}
}

// waitMetrics polls reg every poll until its exposition contains every
// one of want, and returns it; it fails the test after within.
func waitMetrics(t *testing.T, reg *prometheus.Registry, within, poll time.Duration, want ...string) string {
	t.Helper()
	for deadline := time.Now().Add(within); ; {
		body := gather(t, reg)
		missing := slices.IndexFunc(want, func(m string) bool { return !strings.Contains(body, m) })
		if missing < 0 {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics lack %q after %v", want[missing], within)
		}
		time.Sleep(poll) // polling a condition with a deadline
	}
}

func gather(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			b.WriteString(mf.GetName())
			if len(m.GetLabel()) > 0 {
				b.WriteString("{")
				for i, l := range m.GetLabel() {
					if i > 0 {
						b.WriteString(",")
					}
					b.WriteString(l.GetName() + `="` + l.GetValue() + `"`)
				}
				b.WriteString("}")
			}
			switch {
			case m.Gauge != nil:
				b.WriteString(" " + ftoa(m.GetGauge().GetValue()))
			case m.Counter != nil:
				b.WriteString(" " + ftoa(m.GetCounter().GetValue()))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// TestTakeOver runs two replicas of eu on one store: the holder dies
// without releasing its lease, the other takes over after the lease
// lapses, restores the persisted state and goes on: eu's share never jumps,
// the shares never sum above PPM, and the exchange still follows demand.
func TestTakeOver(t *testing.T) {
	c := newCluster(t, 50*time.Millisecond, "eu", "us")
	us := c.start("us", "us-0")
	eu := []*replica{c.start("eu", "eu-0"), c.start("eu", "eu-1")}
	var mu sync.Mutex
	rates := map[string]int64{"eu": 800, "us": 200}
	var dead *replica
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Half of eu's demand arrives at each replica; after the crash all of
	// it at the survivor.
	for i := range eu {
		demand(&wg, stop, func() int64 { mu.Lock(); defer mu.Unlock(); return rates["eu"] / 2 }, func() *replica {
			mu.Lock()
			defer mu.Unlock()
			if eu[i] == dead {
				return eu[1-i]
			}
			return eu[i]
		})
	}
	demand(&wg, stop, func() int64 { mu.Lock(); defer mu.Unlock(); return rates["us"] }, func() *replica { return us })
	defer func() { close(stop); wg.Wait() }()

	target := region.Targets(region.PPM, []float64{800_000, 200_000}, 20_000, nil)
	c.waitShares("eu takes its share", 10*time.Second, func(sh map[string]int64) bool {
		return near(sh["eu"], target[0]) && near(sh["us"], target[1])
	})
	holder, other := eu[0], eu[1]
	if !holder.x.Leader() {
		holder, other = other, holder
	}
	if !holder.x.Leader() || other.x.Leader() {
		t.Fatalf("got leaders %v and %v, want exactly one", eu[0].x.Leader(), eu[1].x.Leader())
	}
	before := c.share("eu", testKey)
	_ = holder.x.Close()
	mu.Lock()
	dead = holder
	mu.Unlock()

	deadline := time.Now().Add(10 * time.Second)
	for !other.x.Leader() {
		if sh := c.shares(testKey); sh["eu"] < before-50_000 || sh["eu"]+sh["us"] > region.PPM {
			t.Fatalf("during the take-over eu holds %d ppm (before %d), us %d", sh["eu"], before, sh["us"])
		}
		if time.Now().After(deadline) {
			t.Fatal("no take-over within 10s")
		}
		time.Sleep(c.period / 5) // polling interval, not a wait for an event
	}
	c.waitShares("after the take-over", time.Second, func(sh map[string]int64) bool {
		if sh["eu"] < before-50_000 {
			t.Fatalf("eu holds %d ppm after the take-over, before %d", sh["eu"], before)
		}
		return near(sh["eu"], target[0])
	})

	mu.Lock()
	rates = map[string]int64{"eu": 200, "us": 800}
	mu.Unlock()
	defer func() {
		if t.Failed() {
			t.Logf("us metrics:\n%s", gather(t, us.reg))
			t.Logf("eu metrics:\n%s", gather(t, other.reg))
		}
	}()
	c.waitShares("us takes the share from the new holder", 10*time.Second, func(sh map[string]int64) bool {
		return near(sh["eu"], target[1]) && near(sh["us"], target[0])
	})
}

// TestLostShareWritesAreRewritten: eu gives its share to us, then its store
// loses the writes since (a Redis failover to a stale replica, modelled by
// restoring an older copy of the memory store): eu's store holds the share
// it gave away again. The store's new incarnation makes eu write every
// share again at its next epoch, so the shares are back to summing to at
// most PPM within an epoch or two. With no demand anywhere the shares have
// stopped moving, so nothing else would ever write eu's share again
// (simulations' TestFailoverLosingAGift shows what that costs when demand
// comes back: eu admits on share it gave away, over the bound).
func TestLostShareWritesAreRewritten(t *testing.T) {
	c := newCluster(t, 50*time.Millisecond, "eu", "us")
	reps, setRates := c.runDemand(map[string]int64{"eu": 900, "us": 100})

	c.waitShares("eu takes the share", 10*time.Second, func(sh map[string]int64) bool { return sh["eu"] > 800_000 })
	old := c.byName["eu"].store.Clone()
	setRates(map[string]int64{"eu": 0, "us": 900})
	c.waitShares("eu gives it to us", 10*time.Second, func(sh map[string]int64) bool { return sh["us"] > 900_000 })
	// Stop all demand and wait for both shares to settle (the smoothed
	// demands decay until the targets stop moving; the key goes idle only
	// after a minute): unchanged over 10 periods, so that nothing but the
	// resync can write eu's share again.
	setRates(map[string]int64{})
	var settled, settledUS int64
	same := 0
	c.waitShares("the shares settle", 20*time.Second, func(sh map[string]int64) bool {
		if sh["eu"] != settled || sh["us"] != settledUS {
			settled, settledUS, same = sh["eu"], sh["us"], 0
		}
		same++
		return same > 50 // polls are period/5 apart
	})

	c.byName["eu"].store.Restore(old) // the failover: eu's gift is undone in its store
	if got := c.share("eu", testKey); got < 800_000 {
		t.Fatalf("after the restore eu's store holds %d ppm, want the old share above 800,000", got)
	}
	// Within a few periods (an epoch, plus scheduling on a loaded machine)
	// the share eu gave away is gone from its store again.
	start := time.Now()
	for c.share("eu", testKey) != settled {
		if time.Since(start) > 10*c.period {
			t.Fatalf("eu's store still holds %d ppm %v after losing its writes, want %d again", c.share("eu", testKey), 10*c.period, settled)
		}
		time.Sleep(c.period / 10) // polling interval, not a wait for an event
	}
	t.Logf("eu's store back from the lost writes after %v (period %v)", time.Since(start), c.period)
	c.waitShares("shares sum to at most PPM", time.Second, func(map[string]int64) bool { return true })
	// The epoch counts the resync after its writes, which the loop above
	// may have seen first: within 20 periods of losing them in all.
	waitMetrics(t, reps["eu"].reg, 20*c.period-time.Since(start), c.period/10, "ration_exchange_store_resyncs_total 1\n")
}

// TestIdleAfterReachesRegion checks that Config.IdleAfter is the region
// state's (regiond's -idle-after), set before Tune sees it.
func TestIdleAfterReachesRegion(t *testing.T) {
	pol, err := policy.Parse("test.yaml", []byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	var got time.Duration
	_, err = New(Config{
		Region: "eu", Replica: "eu-0", Regions: []string{"eu", "us"}, Period: time.Second, IdleAfter: 7 * time.Minute,
		Conn: dial(t, startNATS(t)), Store: lease.NewMemoryStore(lease.MemoryConfig{}), Coordinator: NewMemoryCoordinator(nil),
		Policy: func() *policy.Set { return pol }, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Tune:   func(c *region.Config) { got = c.IdleAfter },
	})
	if err != nil {
		t.Fatal(err)
	}
	if got != 7*time.Minute {
		t.Fatalf("region.Config.IdleAfter %v, want 7m", got)
	}
}
