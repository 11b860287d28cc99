package exchange_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
	"github.com/ration-dev/ration/sync/embedded"
	"github.com/ration-dev/ration/sync/exchange"
)

// These tests run the exchange over the NATS topologies a deployment uses:
// a cluster with each region's regiond on a different server, and a
// supercluster with one cluster per region joined by gateways. Every region
// connects as a user that may publish only its own subject.

const (
	fleetPeriod = 100 * time.Millisecond
	fleetPolicy = "rules:\n  - name: r\n    key: [tenant]\n    limit: 1000\n    period: 1s\n    burst: 1000\n"
	fleetWithin = 10 * time.Second // deadline of every wait
)

var (
	fleetKey     = policy.StoreKey("r", "tenant=acme")
	fleetRegions = []string{"ap", "eu", "us"} // sorted, as region.Targets counts them
)

func fleetUsers() []embedded.User {
	var us []embedded.User
	for _, r := range fleetRegions {
		us = append(us, embedded.RegionUser("ration.sync", r, r+"-secret"))
	}
	return us
}

// TestExchangeOverCluster runs us, eu and ap on three different servers of
// one cluster; eu's server then dies and eu fails over to another.
func TestExchangeOverCluster(t *testing.T) {
	start := time.Now()
	c, err := embedded.StartCluster(embedded.ClusterConfig{Size: 3, Server: embedded.Config{Users: fleetUsers()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	t.Logf("cluster of 3 up in %v", time.Since(start))
	u := c.ClientURLs()
	// Each region's own server first, then the others to fail over to.
	f := startFleet(t, map[string][]string{
		"us": {u[0], u[1], u[2]},
		"eu": {u[1], u[2], u[0]},
		"ap": {u[2], u[0], u[1]},
	})
	f.run(func() { c.Servers()[1].Close() })
}

// TestExchangeOverSupercluster runs us, eu and ap each on its own
// two-server cluster, the clusters joined by gateways; eu's server then
// dies and eu fails over to the other server of its cluster.
func TestExchangeOverSupercluster(t *testing.T) {
	start := time.Now()
	var ccs []embedded.ClusterConfig
	for _, r := range fleetRegions {
		ccs = append(ccs, embedded.ClusterConfig{Name: r, Size: 2, Server: embedded.Config{Users: fleetUsers()}})
	}
	sc, err := embedded.StartSupercluster(embedded.SuperclusterConfig{Clusters: ccs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	t.Logf("supercluster of 3×2 up in %v", time.Since(start))
	urls := map[string][]string{}
	clusters := map[string]*embedded.Cluster{}
	for _, c := range sc.Clusters() {
		u := c.ClientURLs()
		urls[c.Name()] = []string{u[1], u[0]}
		clusters[c.Name()] = c
	}
	f := startFleet(t, urls)
	f.run(func() { clusters["eu"].Servers()[1].Close() })
}

// site is one region: one Exchanger on a memory store, with its own NATS
// connection.
type site struct {
	name        string
	url         string // the server it is meant to connect to first
	nc          *nats.Conn
	store       *lease.MemoryStore
	x           *exchange.Exchanger
	reg         *prometheus.Registry
	reconnected chan string // the URL of each reconnect
	asyncErr    chan error  // errors the server reported asynchronously
}

// fleet is the three regions with a demand generator.
type fleet struct {
	t     *testing.T
	sites map[string]*site

	mu   sync.Mutex
	rate map[string]int64 // demand per region, tokens/s

	stop chan struct{}
	wg   sync.WaitGroup

	observations int // calls of shares, each checking the sum
}

func startFleet(t *testing.T, urls map[string][]string) *fleet {
	t.Helper()
	pol, err := policy.Parse("fleet.yaml", []byte(fleetPolicy))
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, sites: map[string]*site{}, rate: map[string]int64{}, stop: make(chan struct{})}
	for _, r := range fleetRegions {
		s := &site{
			name:        r,
			url:         urls[r][0],
			store:       lease.NewMemoryStore(lease.MemoryConfig{}),
			reg:         prometheus.NewRegistry(),
			reconnected: make(chan string, 16),
			asyncErr:    make(chan error, 16),
		}
		s.nc, err = nats.Connect(strings.Join(urls[r], ","),
			nats.UserInfo(r, r+"-secret"),
			nats.DontRandomize(),
			nats.MaxReconnects(-1),
			nats.ReconnectWait(20*time.Millisecond),
			nats.ReconnectHandler(func(nc *nats.Conn) { offer(s.reconnected, nc.ConnectedUrl()) }),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { offer(s.asyncErr, err) }),
		)
		if err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		t.Cleanup(s.nc.Close)
		if got := s.nc.ConnectedUrl(); got != s.url {
			t.Fatalf("%s connected to %s, want %s", r, got, s.url)
		}
		s.x, err = exchange.New(exchange.Config{
			Region:      r,
			Replica:     r + "-0",
			Regions:     fleetRegions,
			Period:      fleetPeriod,
			Conn:        s.nc,
			Store:       s.store,
			Coordinator: exchange.NewMemoryCoordinator(nil),
			Policy:      func() *policy.Set { return pol },
			Registerer:  s.reg,
			Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.x.Start(); err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		t.Cleanup(func() {
			if err := s.x.Shutdown(context.Background()); err != nil {
				t.Errorf("%s: Close: %v", r, err)
			}
		})
		f.sites[r] = s
	}
	f.wg.Add(1)
	go f.demand()
	t.Cleanup(func() { close(f.stop); f.wg.Wait() })
	return f
}

// offer sends v if ch has room: callbacks of nats.go must not block.
func offer[T any](ch chan T, v T) {
	select {
	case ch <- v:
	default:
	}
}

// demand observes each region's rate of demand for fleetKey, all of it
// granted, in 5ms steps until stop is closed.
func (f *fleet) demand() {
	defer f.wg.Done()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	last := time.Now()
	owed := map[string]float64{} // tokens due but not observed yet
	for {
		select {
		case <-f.stop:
			return
		case now := <-t.C:
			f.mu.Lock()
			for r, rate := range f.rate {
				owed[r] += float64(rate) * now.Sub(last).Seconds()
				if d := int64(owed[r]); d > 0 {
					owed[r] -= float64(d)
					f.sites[r].x.Observe(fleetKey, nil, d, d)
				}
			}
			f.mu.Unlock()
			last = now
		}
	}
}

func (f *fleet) setRates(rate map[string]int64) {
	f.mu.Lock()
	f.rate = rate
	f.mu.Unlock()
}

// targets are the max-min targets of demand rate (tokens/s of L = 1000/s)
// with the default 2% floor.
func targets(rate map[string]int64) map[string]int64 {
	need := make([]float64, len(fleetRegions))
	for i, r := range fleetRegions {
		need[i] = float64(rate[r]) * 1000 // tokens/s of 1000/s, in ppm
	}
	out := map[string]int64{}
	for i, t := range region.Targets(region.PPM, need, 20_000, nil) {
		out[fleetRegions[i]] = t
	}
	return out
}

// run is the scenario both topologies share: demand in eu pulls share
// there; us's forged report for eu is rejected; eu's server dies and eu's
// connection fails over; demand moves to us and the shares follow, which
// needs eu to hear us and us to hear eu over the new connection.
func (f *fleet) run(killEU func()) {
	t := f.t
	begin := time.Now()
	first := map[string]int64{"eu": 900, "us": 100}
	f.setRates(first)
	f.waitHeard()
	t.Logf("every region heard both peers after %v", time.Since(begin))
	f.waitShares("eu takes the share", targets(first))
	t.Logf("shares at eu's target after %v", time.Since(begin))

	// us publishes a report for eu: the server rejects it.
	forged := []byte("forged report of eu")
	if err := f.sites["us"].nc.Publish("ration.sync.eu", forged); err != nil {
		t.Fatal(err)
	}
	f.waitAsyncErr("us", "ration.sync.eu")

	eu := f.sites["eu"]
	killed := time.Now()
	killEU()
	select {
	case u := <-eu.reconnected:
		if u == eu.url {
			t.Fatalf("eu reconnected to %s, the server that died", u)
		}
		t.Logf("eu reconnected to %s %v after its server %s died", u, time.Since(killed), eu.url)
	case <-time.After(fleetWithin):
		t.Fatalf("eu did not reconnect within %v after its server died", fleetWithin)
	}

	moved := time.Now()
	second := map[string]int64{"eu": 100, "us": 900}
	f.setRates(second)
	f.waitShares("us takes the share from eu after the fail-over", targets(second))
	t.Logf("shares at us's target %v after demand moved", time.Since(moved))

	// Every region has now had a report us published after the forgery
	// (us's share rose only after it): had the server passed the forgery
	// on, it would have arrived before and been dropped as undecodable.
	f.waitPeerShare("us", targets(second)["us"]-50_000)
	f.waitHeard()
	t.Logf("%d observations of the shares, every one summing to at most %d ppm; %v in all", f.observations, region.PPM, time.Since(begin))
	_, err := codec.DecodePart(forged, codec.Limits{})
	reason, ok := codec.ReasonOf(err)
	if !ok {
		t.Fatalf("decoding the forgery: got %v, want a drop", err)
	}
	for _, r := range fleetRegions {
		if n := metric(t, f.sites[r].reg, "ration_exchange_dropped_total", "reason", string(reason)); n != 0 {
			t.Errorf("%s dropped %v messages as %s, want 0: the forgery reached it", r, n, reason)
		}
	}
}

// waitHeard waits until every region's latest epoch saw a report of each
// peer no older than two periods.
func (f *fleet) waitHeard() {
	f.wait("every region hears both peers", func() (bool, string) {
		var stale []string
		for _, r := range fleetRegions {
			for _, p := range fleetRegions {
				if p == r {
					continue
				}
				age, ok := find(f.t, f.sites[r].reg, "ration_exchange_report_age_seconds", "region", p)
				if !ok || age > 2*fleetPeriod.Seconds() {
					stale = append(stale, fmt.Sprintf("%s of %s (%v, %.3fs)", r, p, ok, age))
				}
			}
		}
		return len(stale) == 0, "not heard lately: " + strings.Join(stale, ", ")
	})
}

// waitShares waits until every region's applied share of fleetKey is
// within 5% of its target, failing at once if the shares ever sum above
// one.
func (f *fleet) waitShares(what string, target map[string]int64) {
	f.wait(what, func() (bool, string) {
		sh := f.shares()
		for _, r := range fleetRegions {
			if d := sh[r] - target[r]; d < -50_000 || d > 50_000 {
				return false, "shares " + fmtShares(sh) + ", targets " + fmtShares(target)
			}
		}
		return true, ""
	})
}

// waitPeerShare waits until every region's latest report from r (r's own
// state for r) shows a share of at least min.
func (f *fleet) waitPeerShare(r string, min int64) {
	f.wait("every region sees "+r+"'s new share", func() (bool, string) {
		for _, s := range fleetRegions {
			if v := metric(f.t, f.sites[s].reg, "ration_exchange_share_ppm", "region", r); v < float64(min) {
				return false, s + " sees " + r + " at " + fmtPPM(int64(v))
			}
		}
		return true, ""
	})
}

func (f *fleet) waitAsyncErr(r, subject string) {
	select {
	case err := <-f.sites[r].asyncErr:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
			f.t.Fatalf("%s: got async error %v, want a permissions violation on %s", r, err, subject)
		}
	case <-time.After(fleetWithin):
		f.t.Fatalf("the server did not reject %s's publish on %s within %v", r, subject, fleetWithin)
	}
}

// wait polls cond until it holds, checking Σ shares ≤ PPM at every poll,
// and fails after fleetWithin with cond's description of what it saw.
func (f *fleet) wait(what string, cond func() (bool, string)) {
	f.t.Helper()
	deadline := time.Now().Add(fleetWithin)
	tick := time.NewTicker(fleetPeriod / 5) // polling interval, not a wait for an event
	defer tick.Stop()
	for {
		f.shares() // checks the sum
		ok, saw := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: not within %v; %s", what, fleetWithin, saw)
		}
		<-tick.C
	}
}

// shares reads every region's applied share of fleetKey and fails if they
// sum above PPM. The stores are read twice, one after the other, and each
// region's lower reading kept: a gift lowers the giver before it raises
// the receiver, so a single pass that read the giver before and the
// receiver after one gift would count it twice; the second reading of the
// giver comes after the raise that the first pass saw.
func (f *fleet) shares() map[string]int64 {
	f.t.Helper()
	sh := map[string]int64{}
	for pass := range 2 {
		for _, r := range fleetRegions {
			s := f.sites[r]
			out := []int64{0}
			if err := s.store.Shares(context.Background(), []string{fleetKey}, out); err != nil {
				f.t.Fatal(err)
			}
			if out[0] < 0 { // never written: the initial share
				out[0] = s.x.InitialShare(fleetKey, nil)
			}
			if pass == 0 || out[0] < sh[r] {
				sh[r] = out[0]
			}
		}
	}
	f.observations++
	var sum int64
	for _, v := range sh {
		sum += v
	}
	if sum > region.PPM {
		f.t.Fatalf("shares %s sum to %d ppm, more than %d", fmtShares(sh), sum, region.PPM)
	}
	return sh
}

func fmtShares(sh map[string]int64) string {
	var parts []string
	for _, r := range fleetRegions {
		parts = append(parts, r+"="+fmtPPM(sh[r]))
	}
	return strings.Join(parts, " ")
}

func fmtPPM(v int64) string {
	return fmt.Sprintf("%.1f%%", float64(v)/10_000)
}

// metric returns the value of the gauge or counter name with label
// key=value in reg, 0 if there is none.
func metric(t *testing.T, reg *prometheus.Registry, name, key, value string) float64 {
	v, _ := find(t, reg, name, key, value)
	return v
}

// find returns the value of the gauge or counter name with label
// key=value in reg and whether there is one.
func find(t *testing.T, reg *prometheus.Registry, name, key, value string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == name })
	if i < 0 {
		return 0, false
	}
	for _, m := range mfs[i].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() != key || l.GetValue() != value {
				continue
			}
			switch {
			case m.Gauge != nil:
				return m.GetGauge().GetValue(), true
			case m.Counter != nil:
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}
