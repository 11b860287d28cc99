package sim

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
)

// Algorithm is how the quota is coordinated in a run.
type Algorithm string

const (
	// Escrow is ration: agents lease from regional buckets whose shares the
	// regions move between them (DESIGN.md).
	Escrow Algorithm = "escrow"
	// Static is the same agents and regional buckets with every region
	// holding L ÷ regions for good: no exchange.
	Static Algorithm = "static"
	// Ideal is one global token bucket that every request asks, with no
	// latency: the reference the bound is stated against.
	Ideal Algorithm = "ideal"
)

// Algorithms lists the algorithms in table order.
var Algorithms = []Algorithm{Escrow, Static, Ideal}

// simKey is one rate-limited key of the scenario.
type simKey struct {
	group    int
	rule     *policy.Rule
	ds       []policy.Descriptor
	storeKey string // as lease/service names it in the store: rule/key
	rate     float64
	burst    float64
	cost     int64
}

// regiond is one region: its store, its lease service, its exchange state
// and its agents.
type regiond struct {
	idx   int
	name  string
	store *lease.MemoryStore
	svc   *service.Service
	// keeper is the store as the lease service grants from it and the
	// exchange writes shares to it, as in regiond (escrow only).
	keeper  *service.ShareKeeper
	node    *region.Node // its exchange: a new one when the regiond restarts
	initial int64
	skew    int64 // its clock is ahead of true time by skew
	// storeSkew is skew in whole milliseconds: its store's and lease
	// service's clock. The stores count time in µs and expire keys in ms,
	// so a whole-ms offset changes no token bucket's arithmetic, while it
	// moves the fixed windows the stores are in.
	storeSkew int64
	// partitioned counts the partitions in force that cut it off, and
	// unreachable the outages that cut its agents off from it.
	partitioned, unreachable int
	// down counts the restarts in progress: the regiond runs no exchange,
	// and comes back with persisted, the state it last persisted.
	down      int
	persisted *region.Snapshot
	rcfg      region.Config
	agents    []*agentSim // alive
	serial    int
	snap      *lease.MemoryStore    // the state a failover falls back to
	dry       <-chan service.DryKey // the service's dry-key notices (WatchDry)
	// base is the policy the region loaded (the scenario's, or another
	// during a policy mismatch); enforced what its service and agents
	// enforce: base with the rules it disagrees on made stricter
	// (policy.Set.Agreed), as regiond does. agreeGen is the node's
	// Disagreements counter that enforced follows.
	base, enforced *policy.Set
	agreeGen       uint64
	// px is its RLQS proxies, which serve its requests instead of agents
	// (rlqs.go); nil: none.
	px *regionProxies
}

// agentSim is one agent of a region.
type agentSim struct {
	d  *agent.Driver
	r  *regiond
	id uint64 // its region's index and serial, for its draws (callDraw)
	// callAt and callN number its calls sent at one instant (callNumber).
	callAt   int64
	callN    uint64
	alive    bool
	nextTick int64
	dirty    bool // in world.dirty
}

// observer passes lease/service's tallies of global keys to the region's
// exchange (the one in force: a restarted regiond has a new one), as
// regiond's exchanger does.
type observer struct{ r *regiond }

func (o observer) Observe(key string, _ *policy.Rule, demand, granted int64) {
	o.r.node.Observe(key, demand, granted)
}

// world is one run.
type world struct {
	// noDry drops the regionds' dry-key notices (tests of the worst case:
	// agents that do not hear them, an older agent or a broken stream).
	noDry bool

	sc    *Scenario
	alg   Algorithm
	base  time.Time
	now   int64 // ns since base
	set   *policy.Set
	keys  []simKey
	pick  alias
	rs    []*regiond
	ev    eventQueue
	arr   *rand.Rand // arrivals
	net   *rand.Rand // network and faults
	m     *meter
	agCfg agent.Config
	ctx   context.Context

	ideal    *lease.MemoryStore // the ideal algorithm's one bucket
	idealReq []lease.GrantRequest
	idealOut []lease.Grant

	rates    []float64 // requests/s per region at the current step
	poisson  []poissonDraw
	counts   []int       // requests left to draw per region in this step
	dirty    []*agentSim // agents to poll at the end of the step
	tick     int64       // the agents' refresher tick
	nextScan int64       // the next tick at which to look for due agents
	demandAt int         // index of the demand step in force
	dead     []agent.Stats
	terms    []openTerm // excess terms of faults still open
	restarts bool       // the scenario restarts a regiond: persist states
	// reclaimKeys are the keys whose rule may reclaim (store key → index),
	// reclaimOpen those with a reclaim term open.
	reclaimKeys map[string]int
	reclaimOpen map[int]bool
	// windowKeys are the fixed-window keys (store key → index).
	windowKeys map[string]int
	// mismatched are the policies of policy_mismatch faults (by index).
	mismatched map[int]*policy.Set

	px *proxyWorld // the RLQS proxies (rlqs.go); nil: none

	natsMsgs, natsBytes, shareWrites, idealOps int64
	recvStale, recvErrors                      int64
	firstErr                                   error
}

// storeTimeout is the lease services' StoreTimeout in a run: longer than any
// run, since simulated time decides when a store answers.
const storeTimeout = 100_000 * time.Hour

// callCtx is the context of the simulator's calls into lease services. Its
// deadline, earlier than any the service derives from StoreTimeout, makes
// context.WithTimeout there return a plain cancel context instead of
// starting a real timer per call; it is never done.
type callCtx struct {
	context.Context
	deadline time.Time
}

func (c callCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func newWorld(sc *Scenario, alg Algorithm) (*world, error) {
	w := &world{
		sc: sc, alg: alg, base: sc.Start, ctx: callCtx{context.Background(), time.Now().Add(storeTimeout / 2)},
		arr: rand.New(rand.NewPCG(sc.Seed, 0x61727269)),
		net: rand.New(rand.NewPCG(sc.Seed, 0x6e6574)),
	}
	if err := w.buildPolicy(); err != nil {
		return nil, err
	}
	if err := w.mismatch(); err != nil {
		return nil, err
	}
	for _, f := range sc.Faults {
		w.restarts = w.restarts || f.Kind == "restart"
	}
	w.rates = make([]float64, len(sc.Regions))
	w.poisson = make([]poissonDraw, len(sc.Regions))
	w.counts = make([]int, len(sc.Regions))
	w.agCfg = agent.Config{LeasePeriod: sc.LeasePeriod, LeaseTTL: sc.LeaseTTL, Logger: slog.New(slog.DiscardHandler)}
	for i, name := range sc.Regions {
		r := &regiond{idx: i, name: name, base: w.set, enforced: w.set}
		r.rcfg = region.Config{Self: name, Regions: sc.Regions, Period: sc.SyncPeriod,
			Policy: func(key string) region.KeyPolicy { return r.base.RuleOf(key).KeyPolicy() },
			Rules:  func() (string, []region.RuleDef) { return r.base.Version(), r.base.Defs() }}
		if err := w.newNode(r); err != nil {
			return nil, err
		}
		r.initial = r.node.Initial(name)
		if sc.Network.ClockSkew > 0 {
			r.skew = w.net.Int64N(2*int64(sc.Network.ClockSkew)+1) - int64(sc.Network.ClockSkew)
			r.storeSkew = r.skew / int64(time.Millisecond) * int64(time.Millisecond)
		}
		// The region's store and lease service run on its clock, which
		// picks the fixed windows its buckets are in.
		clock := func() time.Time { return w.regionTime(r) }
		r.store = lease.NewMemoryStore(lease.MemoryConfig{Clock: clock, Shards: 1})
		initial := r.initial
		cfg := service.Config{
			Region: name, Store: r.store, Policy: w.set, LeaseTTL: sc.LeaseTTL,
			InitialShareFor: func(string, *policy.Rule) int64 { return initial },
			// A simulated store answers when the simulator says so: the
			// timeout never fires, and callCtx makes it cost no timer.
			StoreTimeout: storeTimeout,
			Logger:       slog.New(slog.DiscardHandler), Clock: clock,
			// Nobody asks the simulated region for its top keys.
			TopKeys: -1,
		}
		var err error
		if alg == Escrow {
			cfg.Observer = observer{r}
			cfg.ShareRetryAfter = sc.SyncPeriod
			r.keeper, err = service.NewShareKeeper(service.ShareKeeperConfig{Store: r.store, Clock: clock, Write: regionFx{w, r}.write()})
			if err != nil {
				return nil, fmt.Errorf("sim: region %s: %w", name, err)
			}
			cfg.Store = r.keeper
		}
		if r.svc, err = service.New(cfg); err != nil {
			return nil, fmt.Errorf("sim: region %s: %w", name, err)
		}
		r.dry, _ = r.svc.SubscribeDry() // for the whole run
		w.rs = append(w.rs, r)
	}
	if alg == Ideal {
		w.ideal = lease.NewMemoryStore(lease.MemoryConfig{Clock: func() time.Time { return w.base.Add(dur(w.now)) }, Shards: 1})
		w.idealReq = make([]lease.GrantRequest, len(w.keys))
		w.idealOut = make([]lease.Grant, 1)
	} else {
		if err := w.newProxies(); err != nil {
			return nil, err
		}
		for _, r := range w.rs {
			for j := 0; j < sc.AgentsPerRegion && !r.proxied(); j++ {
				if err := w.addAgent(r); err != nil {
					return nil, err
				}
			}
		}
	}
	w.m = newMeter(w)
	return w, nil
}

// buildPolicy writes the scenario's keys as a policy document and parses
// it with the policy package, so that agents and services run real rules.
// A group whose limits vary gets one rule per distinct limit; every rule
// matches the descriptor rule=<its name> and keys on <group>=<key>.
func (w *world) buildPolicy() error {
	var doc strings.Builder
	doc.WriteString("rules:\n")
	type ruleOf struct {
		name  string
		limit int64
	}
	var keyRules []ruleOf
	seen := map[string]bool{}
	for _, g := range w.sc.Keys {
		for i := 0; i < g.Count; i++ {
			limit := g.keyLimit(i)
			name := g.Name
			if g.LimitMax > g.Limit {
				name = g.Name + "-l" + strconv.FormatInt(limit, 10)
			}
			burst := g.keyBurst(limit)
			if !seen[name] {
				seen[name] = true
				fmt.Fprintf(&doc, "  - {name: %s, match: {rule: %s}, key: [%s], limit: %d, %s, cost: %d, on_error: %s, partition_reclaim_after: %s}\n",
					name, name, g.Name, limit, ruleShape(g, burst), g.Cost, g.OnError, g.ReclaimAfter)
			}
			keyRules = append(keyRules, ruleOf{name, limit})
		}
	}
	set, err := policy.Parse(w.sc.Name+" (generated policy)", []byte(doc.String()))
	if err != nil {
		return fmt.Errorf("sim: the scenario's keys make an invalid policy: %w", err)
	}
	w.set = set
	weights := make([]float64, 0, len(keyRules))
	var sumW float64
	for _, g := range w.sc.Keys {
		sumW += g.Weight
	}
	idx := 0
	for gi, g := range w.sc.Keys {
		ps := groupSpread(g)
		for i := 0; i < g.Count; i++ {
			kr := keyRules[idx]
			r := set.Rule(kr.name)
			value := g.Name
			if g.Count > 1 {
				value = strconv.Itoa(i)
			}
			ds := []policy.Descriptor{{Key: "rule", Value: kr.name}, {Key: g.Name, Value: value}}
			w.keys = append(w.keys, simKey{
				group: gi, rule: r, ds: ds,
				storeKey: policy.StoreKey(r.Name, string(r.AppendKey(nil, ds))),
				rate:     r.Rate(), burst: float64(r.Burst), cost: r.Cost,
			})
			weights = append(weights, g.Weight/sumW*ps[i])
			if r.FixedWindow() {
				if w.windowKeys == nil {
					w.windowKeys = map[string]int{}
				}
				w.windowKeys[w.keys[len(w.keys)-1].storeKey] = len(w.keys) - 1
			}
			if r.PartitionReclaimAfter > 0 {
				if w.reclaimKeys == nil {
					w.reclaimKeys, w.reclaimOpen = map[string]int{}, map[int]bool{}
				}
				w.reclaimKeys[w.keys[len(w.keys)-1].storeKey] = len(w.keys) - 1
			}
			idx++
		}
	}
	w.pick = newAlias(weights)
	return nil
}

// ruleShape writes a group's algorithm, period and burst (or time zone) as
// rule fields.
func ruleShape(g KeyGroup, burst int64) string {
	if g.RuleAlgorithm != FixedWindow {
		return fmt.Sprintf("period: %s, burst: %d", g.Period, burst)
	}
	period := g.Period.String()
	if g.Calendar != "" {
		period = string(g.Calendar)
	}
	zone := "UTC"
	if g.TimeZone != "" {
		zone = g.TimeZone
	}
	return fmt.Sprintf("algorithm: fixed_window, period: %s, time_zone: %s", period, strconv.Quote(zone))
}

// groupSpread is the probability of each key of a group given a request
// to the group: uniform, or Zipf.
func groupSpread(g KeyGroup) []float64 {
	ps := make([]float64, g.Count)
	var sum float64
	for i := range ps {
		ps[i] = 1
		if g.Zipf > 0 {
			ps[i] = 1 / pow(float64(i+1), g.Zipf)
		}
		sum += ps[i]
	}
	for i := range ps {
		ps[i] /= sum
	}
	return ps
}

func (w *world) addAgent(r *regiond) error {
	cfg := w.agCfg
	cfg.AgentID = r.name + "-" + strconv.Itoa(r.serial)
	id := uint64(r.idx)<<32 | uint64(r.serial)
	r.serial++
	d, err := agent.NewDriver(cfg, w.base)
	if err != nil {
		return fmt.Errorf("sim: agent %s: %w", cfg.AgentID, err)
	}
	d.SetPolicy(r.enforced)
	w.tick = int64(d.Tick()) // the same for every agent: one config
	a := &agentSim{d: d, r: r, id: id, alive: true}
	a.nextTick = int64(d.NextTick())
	r.agents = append(r.agents, a)
	return nil
}

// share returns region r's applied share of a key in its store, in ppm.
func (w *world) share(r *regiond, store *lease.MemoryStore, key string) int64 {
	var out [1]int64
	if err := store.Shares(w.ctx, []string{key}, out[:]); err != nil || out[0] < 0 {
		return r.initial
	}
	return out[0]
}

// regionTime is the time on region r's clock (its store's, its lease
// service's and its exchange's), skew ahead of true time.
func (w *world) regionTime(r *regiond) time.Time { return w.base.Add(dur(w.now + r.storeSkew)) }

func (w *world) fail(err error) {
	if w.firstErr == nil {
		w.firstErr = err
	}
}

// keyLimit is the limit of the group's key i: with LimitMax, the keys'
// limits spread evenly over [Limit, LimitMax].
func (g KeyGroup) keyLimit(i int) int64 {
	if g.LimitMax > g.Limit && g.Count > 1 {
		return g.Limit + int64(i)*(g.LimitMax-g.Limit)/int64(g.Count-1)
	}
	return g.Limit
}

// keyBurst is the burst of the group's key whose limit is limit: with
// LimitMax, Burst scaled as the limit is, never below a cost.
func (g KeyGroup) keyBurst(limit int64) int64 {
	if g.LimitMax > g.Limit {
		return max(limit*g.Burst/g.Limit, g.Cost)
	}
	return g.Burst
}
