package main

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/policy"
)

// tick is how often the dispatchers hand out the work that fell due.
const tick = 10 * time.Millisecond

// hotOffset shifts each region's Zipf ranking by this many keys: the
// regions' hottest keys overlap in part, so some hot keys have demand in
// every region and their shares move.
const hotOffset = 50

// hotWeights split the hot traffic between the regions; they rotate by
// one region every sweep round, so demand moves.
var hotWeights = [...]float64{0.6, 0.3, 0.1}

// loadConfig shapes the load.
type loadConfig struct {
	keys    int           // distinct keys, each decided once per sweep
	sweep   time.Duration // how long one pass over every key takes
	first   time.Duration // how long the first pass takes (at most sweep; parse sets it)
	hot     float64       // Zipf-distributed decisions per second, all regions
	zipfS   float64       // Zipf exponent (> 1)
	move    float64       // share of keys whose home region changes every round
	workers int           // goroutines per agent
	seed    uint64
}

// sweepRate is the sweep's decisions per second.
func (c loadConfig) sweepRate() float64 { return float64(c.keys) / c.sweep.Seconds() }

// generator drives the agents: a sweep that decides every key once per
// c.sweep in its home region, and Zipf-distributed hot traffic per region.
// Each key goes to one agent of a region (index mod agents), so the agents
// of a region hold disjoint keys.
type generator struct {
	cfg    loadConfig
	agents [][]*agent.Agent // [region][agent]
	work   [][]chan uint32  // [region][agent]
	start  time.Time        // when the load starts; set before run
	swept  atomic.Int64     // keys dispatched by the sweep
	hot    atomic.Int64     // hot decisions dispatched
}

func newGenerator(cfg loadConfig, agents [][]*agent.Agent) *generator {
	g := &generator{cfg: cfg, agents: agents}
	for _, as := range agents {
		chs := make([]chan uint32, len(as))
		for i := range chs {
			chs[i] = make(chan uint32, 1024)
		}
		g.work = append(g.work, chs)
	}
	return g
}

// run drives the load from g.start until ctx is done and returns once
// every goroutine it started has exited.
func (g *generator) run(ctx context.Context) {
	var workers, dispatchers sync.WaitGroup
	for r, as := range g.agents {
		for i, a := range as {
			for range g.cfg.workers {
				workers.Go(func() { decide(a, g.work[r][i]) })
			}
		}
	}
	dispatchers.Go(func() { g.sweepLoop(ctx) })
	for r := range g.agents {
		rng := rand.New(rand.NewPCG(g.cfg.seed, uint64(r)))
		dispatchers.Go(func() { g.hotLoop(ctx, r, rng) })
	}
	dispatchers.Wait()
	for _, chs := range g.work {
		for _, ch := range chs {
			close(ch)
		}
	}
	workers.Wait()
}

// decide asks a for every key that arrives on work.
func decide(a *agent.Agent, work <-chan uint32) {
	ds := []policy.Descriptor{{Key: "user"}}
	var buf [16]byte
	for k := range work {
		ds[0].Value = keyName(buf[:0], k)
		a.Allow(context.Background(), ds, 1)
	}
}

// keyName is the user a key index stands for.
func keyName(buf []byte, k uint32) string {
	return string(strconv.AppendUint(append(buf, 'u'), uint64(k), 10))
}

// sweepLoop dispatches every key once per sweep, in key order, at an even
// rate. When the agents cannot keep up the dispatch blocks and falls
// behind; lag says by how much.
func (g *generator) sweepLoop(ctx context.Context) {
	t := time.NewTicker(tick)
	defer t.Stop()
	n := int64(g.cfg.keys)
	for {
		var due int64
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			due = g.due(now)
		}
		for s := g.swept.Load(); s < due; s++ {
			k := uint32(s % n)
			if !g.send(ctx, g.home(k, s/n), k) {
				return
			}
			g.swept.Store(s + 1)
		}
	}
}

// hotLoop dispatches region r's Zipf-distributed demand.
func (g *generator) hotLoop(ctx context.Context, r int, rng *rand.Rand) {
	n := uint64(g.cfg.keys)
	zipf := rand.NewZipf(rng, g.cfg.zipfS, 1, n-1)
	t := time.NewTicker(tick)
	defer t.Stop()
	last, owed := g.start, 0.0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			round := g.swept.Load() / int64(g.cfg.keys)
			w := hotWeights[(r+int(round))%len(hotWeights)]
			owed += g.cfg.hot * w * now.Sub(last).Seconds()
			last = now
		}
		for ; owed >= 1; owed-- {
			k := uint32((zipf.Uint64() + uint64(r)*hotOffset) % n)
			if !g.send(ctx, r, k) {
				return
			}
			g.hot.Add(1)
		}
	}
}

// send hands key k to its agent in region r; false once ctx is done.
func (g *generator) send(ctx context.Context, r int, k uint32) bool {
	chs := g.work[r]
	select {
	case chs[int(k)%len(chs)] <- k:
		return true
	case <-ctx.Done():
		return false
	}
}

// home is the region whose agents the sweep sends key k to in round:
// fixed for most keys, moving on by one region every round for a share
// cfg.move of them.
func (g *generator) home(k uint32, round int64) int {
	h := mix(uint64(k) ^ g.cfg.seed)
	n := uint64(len(g.agents))
	if float64(h>>11)/(1<<53) < g.cfg.move {
		return int((h + uint64(round)) % n)
	}
	return int(h % n)
}

// mix is splitmix64's finaliser: a key's stable pseudo-random hash.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// due is how many keys the sweep should have dispatched by now: the first
// pass in cfg.first, every later one in cfg.sweep. No key waits longer
// than cfg.sweep between two of its requests, as cfg.first ≤ cfg.sweep.
func (g *generator) due(now time.Time) int64 {
	e, n, first := now.Sub(g.start).Seconds(), float64(g.cfg.keys), g.cfg.first.Seconds()
	if e < first {
		return int64(e / first * n)
	}
	return int64(n + (e-first)*g.cfg.sweepRate())
}

// lag is how many keys the sweep is behind its schedule at now.
func (g *generator) lag(now time.Time) int64 { return max(0, g.due(now)-g.swept.Load()) }
