package region_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/region"
)

// This file models a deployment for the tests: regions running the
// production Node (the protocol and its State) against the production
// memory store (buckets, applied shares and the escrow of tokens; the
// regions spend their demand from it), a modelled persisted state and a
// modelled network (loss, duplication, delay, reordering, partitions), with
// crashes at every effect of the epoch protocol.

// faults are the injected faults, per step; the zero value injects none.
type faults struct {
	loss, dup  float64 // probability a report copy is lost / duplicated
	maxDelay   int     // a copy arrives 1 + U[0, maxDelay] epochs later
	crash      float64 // probability a region crashes during its epoch
	writeFail  float64 // probability a store write fails
	ghostWrite float64 // probability a store write is applied but reported failed
	partition  float64 // probability a healthy region becomes isolated
	partitionN int     // how many epochs an isolation lasts, at most
	// refresh is every region's Config.Refresh in property runs (0: the
	// default): under faults a lost delta waits for its refresh.
	refresh int
	// holdDemand is every region's Config.HoldDemand in property runs.
	holdDemand bool
}

type node struct {
	name      string
	cfg       region.Config
	n         *region.Node
	store     *lease.MemoryStore // buckets and applied shares, at the cluster's clock
	persisted *region.Snapshot
	isolated  int // epochs left in isolation
	restarts  int
	restartAt int  // step of the last restart
	down      bool // not running: no epochs, reports to and from it are lost
	unborn    bool // not started yet: it spends nothing
	onePhase  bool // runs Decide without Tally before it (closing its tallies there)
	// crashIn counts the effects the process still carries out before it
	// dies (-1: it does not); dead: it died during this epoch.
	crashIn int
	dead    bool
}

// st is the node's exchange state, for the tests' checks.
func (nd *node) st() *region.State { return nd.n.State() }

type msg struct {
	to  int
	due int
	rep region.Report
}

// A step is one sync period. The network delivers a report within the step
// it was sent in, as NATS does within milliseconds: a tally report before
// the regions decide (they decide a fraction of a period after publishing
// their tallies, more than the network delay), an exchange report after
// all have decided. Faults add whole steps.

type cluster struct {
	t       testing.TB
	rng     *rand.Rand
	period  time.Duration
	regions []string
	nodes   []*node
	step    int
	now     time.Time
	net     []msg
	f       faults
	// check is called after every store write, after every region's epoch.
	check func(c *cluster, when string)
	after func(c *cluster, i int)
	// trace, when set, is told every report published and every share
	// write, as text.
	trace func(string)
	// allowUnknown accepts ErrUnknownRegion (during region set changes).
	allowUnknown bool
	// ideal is, per key, the balance of one ideal bucket (rate testRate,
	// burst testBurst, full at the start) debited with every region's
	// grants: the fleet's buckets and tokens in flight never hold more.
	ideal map[string]float64
	// rate and burst are every key's L and b in the stores (default
	// testRate and testBurst): set them with the Config's Policy.
	rate, burst float64
	// stats
	delivered, lost, stale, unknown int
	released                        int64 // tokens stores released, in TokenScale units
}

var ctx = context.Background()

func newCluster(t testing.TB, rng *rand.Rand, n int, tweak func(*region.Config)) *cluster {
	t.Helper()
	c := &cluster{t: t, rng: rng, period: time.Second, now: time.Unix(1_700_000_000, 0), ideal: map[string]float64{}, rate: testRate, burst: testBurst}
	for i := 0; i < n; i++ {
		c.regions = append(c.regions, fmt.Sprintf("r%d", i))
	}
	for i, name := range c.regions {
		cfg := region.Config{Self: name, Regions: c.regions, Period: c.period}
		if tweak != nil {
			tweak(&cfg)
		}
		nd := &node{name: name, cfg: cfg, store: lease.NewMemoryStore(lease.MemoryConfig{}), crashIn: -1}
		c.nodes = append(c.nodes, nd)
		c.start(i)
	}
	return c
}

// start runs region i's process afresh: a Node that holds its region's
// election (one replica a region) and restores the persisted state.
func (c *cluster) start(i int) {
	nd := c.nodes[i]
	n, err := region.NewNode(nd.cfg, effects{c, i})
	if err != nil {
		c.t.Fatalf("NewNode(%s): %v", nd.name, err)
	}
	nd.n, nd.dead, nd.crashIn = n, false, -1
	if ch := n.Hold(ctx, region.HoldTaken); !ch.TookOver {
		c.t.Fatalf("step %d: %s takes over: %v", c.step, nd.name, ch.Err)
	}
}

// applied returns region i's applied share of key, as its bucket sees it.
func (c *cluster) applied(i int, key string) int64 {
	nd := c.nodes[i]
	if nd.unborn {
		return 0
	}
	return nd.store.PeekAt(c.now, key, c.limit(i)).SharePPM
}

// Every test key has rate testRate and burst testBurst, one token a request.
const testBurst = 1000.0

// limit is the store's limit of every test key in region i.
func (c *cluster) limit(i int) lease.Limit {
	nd := c.nodes[i]
	return lease.Limit{Rate: c.rate, Burst: c.burst, Cost: 1, InitialShare: nd.n.Initial(nd.name)}
}

// spend grants region i's demand for key from its store, as its agents
// would, and returns the tokens granted.
func (c *cluster) spend(i int, key string, want int64) int64 {
	out := make([]lease.Grant, 1)
	c.nodes[i].store.GrantAt(c.now, []lease.GrantRequest{{Key: key, Want: want, Limit: c.limit(i)}}, out)
	if out[0].Err != nil {
		c.t.Fatalf("step %d: %s grants %s: %v", c.step, c.nodes[i].name, key, out[0].Err)
	}
	return out[0].Granted
}

// sum returns Σ over regions of the applied share of key.
func (c *cluster) sum(key string) int64 {
	var s int64
	for i := range c.nodes {
		s += c.applied(i, key)
	}
	return s
}

// reconfigure restarts a region with a new configuration from its last
// persisted snapshot, as an operator's rollout would.
func (c *cluster) reconfigure(i int, tweak func(*region.Config)) {
	tweak(&c.nodes[i].cfg)
	c.restart(c.nodes[i])
}

func (c *cluster) restart(nd *node) {
	c.start(c.index(nd.name))
	nd.restarts++
	nd.restartAt = c.step
}

func (c *cluster) chance(p float64) bool { return p > 0 && c.rng.Float64() < p }

// deliver hands every due report to its receiver, in random order.
func (c *cluster) deliver() {
	c.rng.Shuffle(len(c.net), func(i, j int) { c.net[i], c.net[j] = c.net[j], c.net[i] })
	keep := c.net[:0]
	for _, m := range c.net {
		if m.due > c.step {
			keep = append(keep, m)
			continue
		}
		nd := c.nodes[m.to]
		if nd.isolated > 0 || nd.down || c.nodes[c.index(m.rep.Region)].isolated > 0 {
			c.lost++
			continue
		}
		err := nd.n.Receive(ctx, c.now, &m.rep)
		switch {
		case err == nil:
			c.delivered++
		case errors.Is(err, region.ErrStale):
			c.stale++
		case errors.Is(err, region.ErrUnknownRegion) && c.allowUnknown:
			c.unknown++
		default:
			c.t.Fatalf("step %d: %s receives from %s: %v", c.step, nd.name, m.rep.Region, err)
		}
	}
	c.net = keep
}

func (c *cluster) index(name string) int {
	i, _ := slices.BinarySearch(c.regions, name)
	return i
}

// publish sends a report to every other region through the faulty network.
func (c *cluster) publish(from int, rep region.Report) {
	if c.trace != nil {
		c.trace(fmt.Sprintf("%s publishes %+v", c.nodes[from].name, rep))
	}
	for to := range c.nodes {
		if to == from {
			continue
		}
		copies := 1
		if c.chance(c.f.dup) {
			copies = 2
		}
		for k := 0; k < copies; k++ {
			if c.chance(c.f.loss) {
				c.lost++
				continue
			}
			delay := 0
			if c.f.maxDelay > 0 {
				delay += c.rng.IntN(c.f.maxDelay + 1)
			}
			c.net = append(c.net, msg{to: to, due: c.step + delay, rep: rep})
		}
	}
}

// write applies one share change to a region's store, unless it fails; a
// ghost write is applied and reported failed (a lost answer). It returns
// the change with the tokens the store released.
func (c *cluster) write(i int, ch region.ShareChange) (region.ShareChange, bool) {
	if c.trace != nil {
		c.trace(fmt.Sprintf("%s writes %+v", c.nodes[i].name, ch))
	}
	if c.chance(c.f.writeFail) {
		return ch, false
	}
	res := make([]lease.ShareResult, 1)
	if err := c.nodes[i].store.SetSharesAt(c.now, []lease.ShareUpdate{lease.ShareUpdateFor(ch, c.limit(i))}, res); err != nil {
		c.t.Fatalf("step %d: %s writes %+v: %v", c.step, c.nodes[i].name, ch, err)
	}
	ch.Released, ch.ReleasedWindow = res[0].Released, res[0].Window
	c.released += ch.Released
	c.checked(fmt.Sprintf("%s writes %s=%d", c.nodes[i].name, ch.Key, ch.SharePPM))
	return ch, !c.chance(c.f.ghostWrite)
}

// remove deletes a retired key's share from a region's store, unless it fails.
func (c *cluster) remove(i int, key string) {
	if c.chance(c.f.writeFail) {
		return
	}
	if err := c.nodes[i].store.DeleteShares(ctx, []string{key}); err != nil {
		c.t.Fatalf("step %d: %s deletes %s: %v", c.step, c.nodes[i].name, key, err)
	}
	c.checked(fmt.Sprintf("%s deletes %s", c.nodes[i].name, key))
}

func (c *cluster) checked(when string) {
	if c.check != nil {
		c.check(c, when)
	}
}

// epoch runs region i's decision, with a crash at a random effect when the
// faults say so; a crashed region restarts from its persisted state.
func (c *cluster) epoch(i int) {
	nd := c.nodes[i]
	if c.chance(c.f.crash) {
		nd.crashIn = c.rng.IntN(5)
	}
	nd.n.Decide(ctx, c.now)
	if nd.dead {
		c.restart(nd)
	}
	nd.crashIn = -1
}

// run advances one epoch for the whole cluster: deliveries, local demand
// (demand(region, key) tokens in the epoch), then every region's epoch in a
// random order.
func (c *cluster) run(keys []string, demand func(region int, key string) int64) {
	c.step++
	c.now = c.now.Add(c.period)
	c.refillIdeal(keys)
	for _, nd := range c.nodes {
		if nd.isolated > 0 {
			nd.isolated--
		} else if c.chance(c.f.partition) && c.f.partitionN > 0 {
			nd.isolated = 1 + c.rng.IntN(c.f.partitionN)
		}
	}
	c.deliver()
	for i, nd := range c.nodes {
		for _, key := range keys {
			if d := demand(i, key); d > 0 && !nd.down {
				nd.n.Observe(key, d, d)
				c.ideal[key] -= float64(c.spend(i, key, d))
			}
		}
	}
	for _, i := range c.rng.Perm(len(c.nodes)) {
		if nd := c.nodes[i]; !nd.down && !nd.onePhase {
			nd.n.Tally(ctx, c.now)
		}
	}
	c.deliver()
	for _, i := range c.rng.Perm(len(c.nodes)) {
		if c.nodes[i].down {
			continue
		}
		c.epoch(i)
		if c.after != nil {
			c.after(c, i)
		}
	}
	c.deliver()
}

// errCrashed is what the effects of a dead process return.
var errCrashed = errors.New("the process died")

// effects are region i's store, persisted state and network in the model.
// A process that crashes dies at an effect: that one and every later one
// of its epoch do nothing.
type effects struct {
	c *cluster
	i int
}

// alive counts one effect down to the crash and reports whether the process
// still carries it out.
func (fx effects) alive() bool {
	nd := fx.c.nodes[fx.i]
	switch {
	case nd.dead:
		return false
	case nd.crashIn == 0:
		nd.dead = true
		return false
	case nd.crashIn > 0:
		nd.crashIn--
	}
	return true
}

func (fx effects) WriteShares(_ context.Context, cs []region.ShareChange) []region.ShareChange {
	var ok []region.ShareChange
	for _, ch := range cs {
		if !fx.alive() {
			continue
		}
		if done, confirmed := fx.c.write(fx.i, ch); confirmed {
			ok = append(ok, done)
		}
	}
	return ok
}

func (fx effects) DeleteShares(_ context.Context, keys []string) {
	for _, key := range keys {
		if fx.alive() {
			fx.c.remove(fx.i, key)
		}
	}
}

func (fx effects) Incarnation(context.Context) (string, error) {
	if !fx.alive() {
		return "", errCrashed
	}
	return "model", nil
}

func (fx effects) Persist(_ context.Context, snap *region.Snapshot) error {
	if !fx.alive() {
		return errCrashed
	}
	nd := fx.c.nodes[fx.i]
	nd.persisted = region.MergeSnapshot(nd.persisted, snap)
	// What the store holds is the state's whole snapshot, key for key.
	if got, want := nd.persisted, region.MergeSnapshot(nil, ptr(nd.st().Snapshot())); !reflect.DeepEqual(sortedSnapshot(got), sortedSnapshot(want)) {
		fx.c.t.Fatalf("step %d: %s persisted (partial %v) %+v\nwant %+v", fx.c.step, nd.name, snap.Partial, got, want)
	}
	return nil
}

func (fx effects) Load(context.Context) (*region.Snapshot, error) {
	return fx.c.nodes[fx.i].persisted, nil
}

func (fx effects) Publish(_ context.Context, rep *region.Report) {
	if nd := fx.c.nodes[fx.i]; fx.alive() && nd.isolated == 0 {
		fx.c.publish(fx.i, *rep)
	}
}

// refillIdeal brings the ideal buckets of keys forward one period.
func (c *cluster) refillIdeal(keys []string) {
	for _, key := range keys {
		b, ok := c.ideal[key]
		if !ok {
			b = c.burst // every region's bucket starts full too
		} else {
			b = min(c.burst, b+c.rate*c.period.Seconds())
		}
		c.ideal[key] = b
	}
}

// fleetTokens returns, for key, Σ of the regions' bucket balances and the
// tokens in flight: given and not yet credited by the receiver's store
// (counted while the receiver can still credit them: its store is not in a
// newer generation).
func (c *cluster) fleetTokens(key string) (buckets, flight float64) {
	given := map[int]map[uint64]int64{} // receiver → generation → Σ given
	gens := make([]uint64, len(c.nodes))
	for i, nd := range c.nodes {
		if nd.unborn {
			continue
		}
		buckets += nd.store.PeekAt(c.now, key, c.limit(i)).Tokens
		gen, row := nd.st().Tokens(key)
		gens[i] = gen
		for j, t := range row {
			if given[j] == nil {
				given[j] = map[uint64]int64{}
			}
			given[j][gen] += t
		}
	}
	for j, nd := range c.nodes {
		if nd.unborn {
			continue
		}
		st := nd.store.PeekAt(c.now, key, c.limit(j))
		switch {
		case st.Gen == gens[j]:
			flight += float64(max(0, given[j][gens[j]]-st.Credited))
		case st.Gen < gens[j]:
			flight += float64(given[j][gens[j]])
		}
	}
	return buckets, flight / region.TokenScale
}

// checkTokens fails the test when the fleet holds more tokens of key than
// the ideal bucket (docs/DESIGN.md, "Tokens move with share"), beyond one
// cost a region (a bucket's capacity never falls below one cost).
func (c *cluster) checkTokens(key, when string) {
	buckets, flight := c.fleetTokens(key)
	if slack := float64(len(c.nodes)) + 1e-6; buckets+flight > c.ideal[key]+slack {
		for i, nd := range c.nodes {
			gen, row := nd.st().Tokens(key)
			c.t.Logf("%s: store %+v; state gen %d given %v; %s", nd.name, nd.store.PeekAt(c.now, key, c.limit(i)), gen, row, nd.st().Debug(key))
		}
		c.t.Fatalf("step %d after %s: %s: the regions hold %.3f tokens and %.3f are in flight, more than the ideal bucket's %.3f + %v",
			c.step, when, key, buckets, flight, c.ideal[key], slack)
	}
}

func ptr[T any](v T) *T { return &v }

// sortedSnapshot is snap with its keys in order, for comparisons.
func sortedSnapshot(snap *region.Snapshot) region.Snapshot {
	out := *snap
	out.Keys = slices.Clone(snap.Keys)
	slices.SortFunc(out.Keys, func(a, b region.KeySnapshot) int { return strings.Compare(a.Key, b.Key) })
	if len(out.Keys) == 0 {
		out.Keys = nil
	}
	return out
}
