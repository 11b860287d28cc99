package service

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ration-dev/ration/lease"
	leasev1 "github.com/ration-dev/ration/lease/v1"
)

// TestDryKeyAnsweredWithoutStore: once a bucket is empty, asks for it from
// every agent are denied from memory, with the store's retry hint, until the
// bucket holds a cost again; then the store is asked.
func TestDryKeyAnsweredWithoutStore(t *testing.T) {
	f := start(t, Config{})
	item := func(want int64) *leasev1.LeaseItem {
		return &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: want, Demand: want}
	}
	if g := f.lease(t, item(200)).Grants[0]; g.GetGranted() != 200 {
		t.Fatalf("got %d, want the bucket's 200", g.GetGranted())
	}
	for i := range 20 {
		resp, err := f.client.Lease(context.Background(), &leasev1.LeaseRequest{Agent: agent(fmt.Sprint("a", i)), Items: []*leasev1.LeaseItem{item(5)}})
		if err != nil {
			t.Fatal(err)
		}
		g := resp.Grants[0]
		if ra := g.GetRetryAfter().AsDuration(); g.GetGranted() != 0 || ra <= 0 || ra > 10*time.Millisecond || g.GetRate() != 100 || g.GetCapacity() != 200 {
			t.Fatalf("ask %d: got %d tokens, retry %v, rate %v, capacity %v; want 0, (0, 10ms], 100, 200", i, g.GetGranted(), ra, g.GetRate(), g.GetCapacity())
		}
	}
	if grants, _ := f.svc.StoreItems(); grants != 1 {
		t.Fatalf("the store saw %d grant items, want 1: asks for a dry key went to it", grants)
	}
	f.clock.Advance(10 * time.Millisecond) // one token at 100/s
	if g := f.lease(t, item(5)).Grants[0]; g.GetGranted() != 1 {
		t.Fatalf("after the refill got %d, want 1", g.GetGranted())
	}
	var m dto.Metric
	if err := f.svc.metrics.dryProbes.Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Errorf("ration_store_items_total{op=probe} = %v (%v), want 1: the ask after the refill probes", m.GetCounter().GetValue(), err)
	}
	if grants, _ := f.svc.StoreItems(); grants != 2 {
		t.Fatalf("the store saw %d grant items, want 2", grants)
	}
	if got := f.svc.Probes(); got != 1 {
		t.Errorf("Probes() got %d, want 1", got)
	}
}

// TestDryKeyForgotten: a return, Forget (a share written) and a new policy
// make the next ask go to the store, which may have tokens again.
func TestDryKeyForgotten(t *testing.T) {
	f := start(t, Config{})
	item := &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 200}
	drain := func() {
		t.Helper()
		f.lease(t, item)
		if f.svc.dry.len() != 1 {
			t.Fatalf("%d keys remembered dry, want 1", f.svc.dry.len())
		}
	}
	ret := func() {
		_, err := f.client.Return(context.Background(), &leasev1.ReturnRequest{Agent: agent("a1"), Items: []*leasev1.ReturnItem{{Rule: "per-tenant", Key: "tenant=acme", Tokens: 50}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name   string
		forget func()
		want   int64
	}{
		{"return", ret, 50},
		{"forget", func() { ret(); f.svc.Forget("per-tenant/tenant=acme") }, 50},
		{"policy", func() { ret(); f.svc.SetPolicy(mustPolicy(t, testPolicy)) }, 50},
	} {
		drain()
		c.forget()
		if g := f.lease(t, item).Grants[0]; g.GetGranted() != c.want {
			t.Errorf("%s: got %d after it, want %d", c.name, g.GetGranted(), c.want)
		}
	}
	// Without the Forget, a return to another replica is only waited out.
	drain()
	if err := f.svc.cfg.Store.Return(context.Background(), []lease.ReturnRequest{{Key: "per-tenant/tenant=acme", Tokens: 50, Limit: f.svc.limitFor("per-tenant/tenant=acme", f.svc.Policy().Rule("per-tenant"), f.clock.Now())}}); err != nil {
		t.Fatal(err)
	}
	if g := f.lease(t, item).Grants[0]; g.GetGranted() != 0 {
		t.Errorf("a return the service did not see: got %d, want the remembered denial", g.GetGranted())
	}
}

// TestDryMemoryDeniesOnlyWhatTheStoreWould runs random asks, returns and
// share writes (each Forget as regiond's exchange does) at random instants
// through a service that remembers dry keys and one that does not, each on
// its own store: every grant must be the same, and the memory must save
// store operations.
func TestDryMemoryDeniesOnlyWhatTheStoreWould(t *testing.T) {
	seed, err := strconv.ParseUint(os.Getenv("RATION_SEED"), 10, 64)
	if err != nil || seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: RATION_SEED=%d go test ./lease/service -run '%s')", seed, seed, t.Name())
	rng := rand.New(rand.NewPCG(seed, 1))
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	pol := mustPolicy(t, testPolicy)
	var svcs [2]*Service
	var stores [2]*lease.MemoryStore
	for i, dryFor := range []time.Duration{0, -1} {
		stores[i] = lease.NewMemoryStore(lease.MemoryConfig{Clock: clk.Now})
		// NoSpacing: a hot key's asks held to its grid are denials the
		// store would not make (TestHotKeyAsksFallOnItsGrid).
		s, err := New(Config{Region: "eu", Store: stores[i], Policy: pol, Clock: clk.Now, DryFor: dryFor, NoSpacing: true, ShareRetryAfter: 300 * time.Millisecond, InitialShare: 500_000, StoreTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		svcs[i] = s
	}
	type pick struct{ rule, key string }
	picks := []pick{{"per-tenant", "tenant=a"}, {"per-tenant", "tenant=b"}, {"costly", "tenant=a"}, {"per-ip", "ip=1"}}
	ctx := context.Background()
	for step := range 20_000 {
		clk.Advance(time.Duration(rng.Int64N(int64(5 * time.Millisecond))))
		p := picks[rng.IntN(len(picks))]
		sk := p.rule + "/" + p.key
		op, n, ppm := rng.IntN(20), 1+rng.Int64N(30), 100_000+rng.Int64N(900_000)
		// What each store's bucket holds before the step: the two agree
		// but for float rounding, since they refill the same bucket at
		// different instants (the one without the memory is asked more).
		lim := svcs[0].limitFor(sk, pol.Rule(p.rule), clk.Now())
		held := [2]float64{stores[0].PeekAt(clk.Now(), sk, lim).Tokens, stores[1].PeekAt(clk.Now(), sk, lim).Tokens}
		var got [2]string
		for i, s := range svcs {
			switch {
			case op == 0:
				_, err := s.Return(ctx, &leasev1.ReturnRequest{Agent: agent("a"), Items: []*leasev1.ReturnItem{{Rule: p.rule, Key: p.key, Tokens: n}}})
				got[i] = fmt.Sprint("return ", err)
			case op == 1 && p.rule != "per-ip":
				ups := []lease.ShareUpdate{{Key: sk, SharePPM: ppm, Limit: s.limitFor(sk, pol.Rule(p.rule), clk.Now())}}
				err := stores[i].SetShares(ctx, ups, make([]lease.ShareResult, 1))
				s.Forget(sk)
				got[i] = fmt.Sprint("share ", err)
			default:
				want := n
				if p.rule == "costly" {
					want = 10 + n // at least its cost
				}
				resp, err := s.Lease(ctx, &leasev1.LeaseRequest{Agent: agent("a"), Items: []*leasev1.LeaseItem{{Rule: p.rule, Key: p.key, Want: want}}})
				if err != nil {
					t.Fatal(err)
				}
				got[i] = fmt.Sprint("granted ", resp.Grants[0].GetGranted())
			}
		}
		if got[0] != got[1] {
			if math.Abs(held[0]-held[1]) < 1e-6 && math.Floor(held[0]) != math.Floor(held[1]) {
				// A rounding tie at a whole token: the stores part by a
				// token from here, so the comparison ends.
				t.Logf("seed %d step %d (%s): the stores held %v and %v tokens, a rounding tie; compared %d steps", seed, step, sk, held[0], held[1], step)
				break
			}
			if c := float64(lim.Cost); got[0] == "granted 0" && held[0] >= c && held[0]-c < lim.Rate*1e-6 {
				// The memory trusts the store's hint, rounded up to
				// its microsecond clock (dry.go): a bucket that
				// reached a cost within the last microsecond is still
				// remembered dry. The stores part by a token from here.
				t.Logf("seed %d step %d (%s): the memory denied a bucket of %v tokens that reached a cost within the store's microsecond; compared %d steps", seed, step, sk, held[0], step)
				break
			}
			t.Fatalf("seed %d step %d (%s): with the memory %s, without %s (the stores held %v and %v tokens)", seed, step, sk, got[0], got[1], held[0], held[1])
		}
	}
	with, _ := svcs[0].StoreItems()
	without, _ := svcs[1].StoreItems()
	t.Logf("grant items sent to the store: %d with the memory, %d without", with, without)
	if with >= without {
		t.Errorf("the memory saved no store operation: %d against %d", with, without)
	}
}

// TestDryMemoryBounded: the memory keeps at most DryKeys keys.
func TestDryMemoryBounded(t *testing.T) {
	f := start(t, Config{DryKeys: 128})
	for i := range 1000 {
		f.lease(t, &leasev1.LeaseItem{Rule: "per-tenant", Key: fmt.Sprint("tenant=", i), Want: 200})
	}
	if n := f.svc.dry.len(); n > 128 || n == 0 {
		t.Fatalf("%d keys remembered, want 1 to 128", n)
	}
}

// gatedStore holds its first Grant call until gate is closed, telling
// entered when it arrives, and counts the items it is asked.
type gatedStore struct {
	Store
	entered, gate chan struct{}
	once          sync.Once
	items         atomic.Int64
}

func (g *gatedStore) Grant(ctx context.Context, reqs []lease.GrantRequest, out []lease.Grant) error {
	g.items.Add(int64(len(reqs)))
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.gate
	}
	return g.Store.Grant(ctx, reqs, out)
}

// TestConcurrentAsksJoin: an ask for a key that another call is asking the
// store for waits for that answer; the first empties the bucket, so the
// second is denied from memory without a store operation of its own.
func TestConcurrentAsksJoin(t *testing.T) {
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	st := &gatedStore{Store: lease.NewMemoryStore(lease.MemoryConfig{Clock: clk.Now}), entered: make(chan struct{}), gate: make(chan struct{})}
	f := start(t, Config{Store: st, Clock: clk.Now})
	waiting := make(chan struct{})
	f.svc.joined = func() { close(waiting) }
	item := func(want int64) []*leasev1.LeaseItem {
		return []*leasev1.LeaseItem{{Rule: "per-tenant", Key: "tenant=acme", Want: want}}
	}
	first := make(chan int64, 1)
	go func() {
		resp, err := f.client.Lease(context.Background(), &leasev1.LeaseRequest{Agent: agent("a1"), Items: item(200)})
		if err != nil {
			t.Error(err)
			first <- -1
			return
		}
		first <- resp.Grants[0].GetGranted()
	}()
	<-st.entered
	second := make(chan int64, 1)
	go func() {
		resp, err := f.client.Lease(context.Background(), &leasev1.LeaseRequest{Agent: agent("a2"), Items: item(5)})
		if err != nil {
			t.Error(err)
			second <- -1
			return
		}
		second <- resp.Grants[0].GetGranted()
	}()
	<-waiting // the second ask waits for the first's answer
	close(st.gate)
	if a, b := <-first, <-second; a != 200 || b != 0 {
		t.Fatalf("got %d and %d tokens, want 200 and 0", a, b)
	}
	if n := st.items.Load(); n != 1 {
		t.Fatalf("the store was asked %d items, want 1: the second ask did not join the first", n)
	}
}

// TestSameKeyTwiceInOneCall: a call asking for one key twice sends both
// asks and does not wait for itself.
func TestSameKeyTwiceInOneCall(t *testing.T) {
	f := start(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	it := &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=twice", Want: 150}
	resp, err := f.client.Lease(ctx, &leasev1.LeaseRequest{Agent: agent("a1"), Items: []*leasev1.LeaseItem{it, it}})
	if err != nil {
		t.Fatalf("a call with one key twice: %v", err)
	}
	if a, b := resp.Grants[0].GetGranted(), resp.Grants[1].GetGranted(); a != 150 || b != 50 {
		t.Fatalf("got %d and %d, want 150 and the bucket's other 50", a, b)
	}
}

// TestWatchDry: a WatchDry stream hears of a key the store reports dry,
// with the time until its bucket can grant.
func TestWatchDry(t *testing.T) {
	f := start(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := f.client.WatchDry(ctx, &leasev1.WatchDryRequest{Agent: agent("a1")})
	if err != nil {
		t.Fatal(err)
	}
	// The stream is subscribed once the server has it; ask until a notice
	// comes (each drain of the 200-token bucket is a new dry answer).
	got := make(chan *leasev1.DryNotice, 1)
	go func() {
		n, err := stream.Recv()
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- n
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		f.lease(t, &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 200})
		select {
		case n := <-got:
			if n == nil {
				return
			}
			k := n.GetKeys()[0]
			if ra := k.GetRetryAfter().AsDuration(); k.GetRule() != "per-tenant" || k.GetKey() != "tenant=acme" || ra <= 0 || ra > 10*time.Millisecond {
				t.Fatalf("notice %v, want per-tenant tenant=acme within (0, 10ms]", n)
			}
			return
		case <-tick.C:
			f.clock.Advance(10 * time.Millisecond) // a new token, a new drain
		case <-ctx.Done():
			t.Fatal("no notice within 5s")
		}
	}
}

// TestHerdSendsWhatTheAnswerCovers: asks that waited for an answer which
// left two tokens send two asks, not one each: the third would reach an
// empty bucket, a store operation that admits nothing. It waits for their
// answers, which leave the key dry, and is denied from memory; and no ask
// stays in flight after.
func TestHerdSendsWhatTheAnswerCovers(t *testing.T) {
	const herd = 3
	h := startHerd(t, herd, "tenant=acme", nil)
	first := make(chan int64, 1)
	go h.ask("a0", 198, first) // of the bucket's 200, at a clock that stands still
	<-h.st.entered
	rest := make(chan int64, herd)
	for i := range herd {
		go h.ask(fmt.Sprint("a", i+1), 1, rest)
	}
	<-h.waiting // the herd waits for the first's answer
	close(h.st.gate)
	if g := <-first; g != 198 {
		t.Fatalf("the first ask got %d, want 198", g)
	}
	var granted []int64
	for range herd {
		granted = append(granted, <-rest)
	}
	if sum := granted[0] + granted[1] + granted[2]; sum != 2 {
		t.Fatalf("the herd got %v, want two tokens between them", granted)
	}
	if n := h.st.items.Load(); n != 3 {
		t.Fatalf("the store was asked %d items, want 3: the first and the two asks its answer covered", n)
	}
	for i := range h.f.svc.dry.shards {
		sh := &h.f.svc.dry.shards[i]
		sh.mu.Lock()
		n := len(sh.flight)
		sh.mu.Unlock()
		if n != 0 {
			t.Fatalf("shard %d holds %d keys in flight after every answer", i, n)
		}
	}
}

// TestHerdGoesTogetherWhenCovered: asks that waited for an answer which
// left plenty go to the store together, not one after another.
func TestHerdGoesTogetherWhenCovered(t *testing.T) {
	const herd = 5
	h := startHerd(t, herd, "tenant=roomy", func(n int64) {
		t.Errorf("an ask waited again (%d waits for a herd of %d): the answer covered it", n, herd)
	})
	got := make(chan int64, herd+1)
	go h.ask("a0", 10, got)
	<-h.st.entered
	for i := range herd {
		go h.ask(fmt.Sprint("a", i+1), 10, got)
	}
	<-h.waiting
	close(h.st.gate)
	for range herd + 1 {
		if g := <-got; g != 10 {
			t.Fatalf("an ask got %d, want 10", g)
		}
	}
}

// herdFixture is a lease service on a gated memory store (its first
// Grant call holds until the gate opens) whose waiting is closed once
// herd asks wait for an answer in flight; ask leases want tokens of key
// for agent id and sends what was granted (-1 on error) to got.
type herdFixture struct {
	f       *fixture
	st      *gatedStore
	waiting chan struct{}
	key     string
	t       *testing.T
}

// startHerd starts a herdFixture; more, if not nil, is called for every
// wait past the herd's.
func startHerd(t *testing.T, herd int64, key string, more func(n int64)) *herdFixture {
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	st := &gatedStore{Store: lease.NewMemoryStore(lease.MemoryConfig{Clock: clk.Now}), entered: make(chan struct{}), gate: make(chan struct{})}
	h := &herdFixture{f: start(t, Config{Store: st, Clock: clk.Now}), st: st, waiting: make(chan struct{}), key: key, t: t}
	var waits atomic.Int64
	h.f.svc.joined = func() {
		if n := waits.Add(1); n == herd {
			close(h.waiting)
		} else if n > herd && more != nil {
			more(n)
		}
	}
	return h
}

func (h *herdFixture) ask(id string, want int64, got chan<- int64) {
	resp, err := h.f.client.Lease(context.Background(), &leasev1.LeaseRequest{Agent: agent(id),
		Items: []*leasev1.LeaseItem{{Rule: "per-tenant", Key: h.key, Want: want}}})
	if err != nil {
		h.t.Error(err)
		got <- -1
		return
	}
	got <- resp.Grants[0].GetGranted()
}

// TestClaimSendsWhatInFlightLeaves: claim and land on the memory itself.
// While an ask is in flight and nothing is known, others wait; its answer
// (two tokens left) lets two of them go and the third wait for theirs; the
// answer that empties the bucket leaves the key dry.
func TestClaimSendsWhatInFlightLeaves(t *testing.T) {
	m := newDryMemory(1024, "", false)
	const key, limit = "per-tenant/tenant=acme", time.Second
	at := int64(1_000_000_000)
	if _, dry, wait, _ := m.claim(key, 198, 1, at); dry || wait != nil {
		t.Fatalf("the first ask: dry %v, wait %v; want it sent", dry, wait)
	}
	var waits []chan struct{}
	for i := range 3 {
		_, dry, wait, _ := m.claim(key, 1, 1, at)
		if dry || wait == nil {
			t.Fatalf("ask %d while the first is in flight: dry %v, wait %v; want it to wait", i, dry, wait)
		}
		waits = append(waits, wait)
	}
	m.land(key, 198, 2, true, at, limit) // the bucket holds 2 after it
	for i, w := range waits {
		select {
		case <-w:
		default:
			t.Fatalf("ask %d not woken by the answer", i)
		}
	}
	sent, waiting := 0, 0
	for range 3 {
		switch _, dry, wait, _ := m.claim(key, 1, 1, at); {
		case dry:
			t.Fatal("a woken ask denied from memory: the bucket holds two")
		case wait != nil:
			waiting++
		default:
			sent++
		}
	}
	if sent != 2 || waiting != 1 {
		t.Fatalf("%d woken asks sent and %d waiting, want 2 and 1", sent, waiting)
	}
	g := lease.Grant{Granted: 1, Tokens: 0, Rate: 100, Capacity: 200}
	l := lease.Limit{Rate: 100, Burst: 200, Cost: 1}
	m.land(key, 1, 1, true, at, limit)
	if _, dry := m.note(key, &g, l, at, at, limit); !dry {
		t.Fatal("the answer that left nothing did not leave the key dry")
	}
	m.land(key, 1, 0, true, at, limit)
	if _, dry, _, _ := m.claim(key, 1, 1, at); !dry {
		t.Fatal("the ask that waited is not denied from memory once the bucket is empty")
	}
}

// TestProbeThatWaitsIsNotSpent: the ask let through as trust passes waits
// when another ask for the key is still in flight; it did not probe, so
// once that ask fails the next one probes rather than being denied as if
// a probe were on its way.
func TestProbeThatWaitsIsNotSpent(t *testing.T) {
	m := newDryMemory(1024, "", false)
	const key, limit = "per-tenant/tenant=acme", time.Second
	at := int64(1_000_000_000)
	if _, dry, wait, _ := m.claim(key, 1, 1, at); dry || wait != nil {
		t.Fatal("the first ask was not sent")
	}
	// Another ask's answer leaves the key dry for 10ms meanwhile.
	g := lease.Grant{RetryAfter: 10 * time.Millisecond, Rate: 100, Capacity: 200}
	if _, dry := m.note(key, &g, lease.Limit{Rate: 100, Burst: 200, Cost: 1}, at, at, limit); !dry {
		t.Fatal("not dry")
	}
	at += int64(10 * time.Millisecond)
	_, dry, wait, probe := m.claim(key, 1, 1, at)
	if dry || wait == nil || probe {
		t.Fatalf("the ask as trust passes: dry %v, wait %v, probe %v; want it to wait for the ask in flight", dry, wait, probe)
	}
	m.land(key, 1, 0, false, at, limit) // the store failed
	if _, dry, wait, probe := m.claim(key, 1, 1, at); dry || wait != nil || !probe {
		t.Fatalf("the ask after: dry %v, wait %v, probe %v; want it to probe", dry, wait, probe)
	}
}

// TestStaleAnswerKeepsNewerDry: two asks of one key went to the store
// together and their answers are noted in the other order. The older ask's
// answer (plenty, or dry for less long) must not forget or shorten what the
// answer noted since it was sent remembers: only the memory's denial is
// safe to keep on a stale answer, and forgetting it let an ask reach an
// empty bucket.
func TestStaleAnswerKeepsNewerDry(t *testing.T) {
	m := newDryMemory(1024, "", false)
	const key, limit = "per-user/user=u1", time.Second
	l := lease.Limit{Rate: 2, Burst: 2, Cost: 1}
	sent := int64(1_000_000_000)
	at := sent + int64(time.Millisecond)
	newer := lease.Grant{Granted: 1, Tokens: 0.16, Rate: 2, Capacity: 2}
	until, dry := m.note(key, &newer, l, sent, at, limit)
	if !dry {
		t.Fatal("an answer that left 0.16 of a cost did not leave the key dry")
	}
	plenty := lease.Grant{Granted: 1, Tokens: 1.16, Rate: 2, Capacity: 2}
	if _, dry := m.note(key, &plenty, l, sent, at+1, limit); dry {
		t.Fatal("the stale answer of plenty says dry")
	}
	if d, dry, _, _ := m.claim(key, 1, 1, at+2); !dry || d.until != until {
		t.Fatalf("after the stale answer of plenty: dry %v until %d, want dry until %d", dry, d.until, until)
	}
	shorter := lease.Grant{Granted: 1, Tokens: 0.9, Rate: 2, Capacity: 2}
	if got, dry := m.note(key, &shorter, l, sent, at+3, limit); !dry || got != until {
		t.Fatalf("the stale shorter answer: dry %v until %d, want the newer %d kept", dry, got, until)
	}
	// An answer to an ask sent after the entry was noted is newer: it
	// forgets the key.
	if _, dry := m.note(key, &plenty, l, at+4, at+5, limit); dry {
		t.Fatal("a fresh answer of plenty says dry")
	}
	if _, dry, _, _ := m.claim(key, 1, 1, at+6); dry {
		t.Fatal("a fresh answer of plenty did not forget the key")
	}
}

// TestHotKeyAsksFallOnItsGrid: an answer to an ask sent as soon as the key
// could grant again (a hot key) leaves it dry until the next instant of
// the region's grid for the key, less than a step after the store's time,
// and the next answers keep to that grid while the key is asked for within
// a step. An ask sent a step after, a bucket that cannot hold a second's
// refill beyond the delay and a region that holds most of the quota keep
// the store's time. Two regions' grids for one key differ.
func TestHotKeyAsksFallOnItsGrid(t *testing.T) {
	const key, limit = "per-user/user=u1", time.Second
	const step = int64(500 * time.Millisecond) // a cost at 2 tokens/s
	l := lease.Limit{Rate: 6, Burst: 24, Cost: 1}
	denied := lease.Grant{RetryAfter: 500 * time.Millisecond, Rate: 2, Capacity: 8}
	start := int64(1_000_000_000)
	hot := func(m *dryMemory, g lease.Grant, prev int64) int64 {
		t.Helper()
		sent := prev + int64(time.Millisecond)
		at := sent + int64(time.Millisecond)
		until, dry := m.note(key, &g, l, sent, at, limit)
		if d := until - (at + int64(g.RetryAfter)); !dry || d < 0 || d >= step {
			t.Fatalf("hot answer: dry %v until %d, %dns after the store's time; want dry less than a step after it", dry, until, d)
		}
		return until
	}
	phase := map[string]int64{}
	for _, region := range []string{"us", "eu"} {
		m := newDryMemory(1024, region, true)
		first, dry := m.note(key, &denied, l, start, start, limit)
		if !dry || first != start+int64(denied.RetryAfter) {
			t.Fatalf("%s: first answer dry %v until %d, want the store's time %d", region, dry, first, start+int64(denied.RetryAfter))
		}
		u1 := hot(m, denied, first)
		// What the grant at u1 left refills a cost by first + two steps.
		left := denied
		left.RetryAfter = time.Duration(first + 2*step - (u1 + 2*int64(time.Millisecond)))
		u2 := hot(m, left, u1)
		if (u2-u1)%step != 0 {
			t.Fatalf("%s: hot answers until %d and %d, not a whole number of steps (%d) apart", region, u1, u2, step)
		}
		phase[region] = u1 % step
		// A key on its grid stays on it while asked for within a step.
		sent := u2 + step/4
		late := left
		late.RetryAfter = time.Duration(step / 2)
		u3, _ := m.note(key, &late, l, sent, sent+int64(time.Millisecond), limit)
		if (u3-u1)%step != 0 || u3 < sent+int64(time.Millisecond)+step/2 {
			t.Fatalf("%s: answer to an ask a quarter step late until %d, not on the grid after %d", region, u3, u2)
		}
		// Asked for a step after the bucket could grant again: as stored.
		sent = u3 + step
		if until, _ := m.note(key, &denied, l, sent, sent, limit); until != sent+int64(denied.RetryAfter) {
			t.Fatalf("%s: cold answer until %d, want the store's time %d", region, until, sent+int64(denied.RetryAfter))
		}
		// Kept to the store's time: a bucket that cannot hold a second's
		// refill beyond any delay, a region that holds more than half
		// the quota (nobody else admits beside it), and one that refills a
		// cost too fast for its place in the step to show in a second's
		// count.
		for _, c := range []struct {
			g lease.Grant
			l lease.Limit
		}{
			{lease.Grant{RetryAfter: denied.RetryAfter, Rate: 2, Capacity: 3}, l},
			{lease.Grant{RetryAfter: 250 * time.Millisecond, Rate: 4, Capacity: 16}, l},
			{lease.Grant{RetryAfter: 5 * time.Millisecond, Rate: 200, Capacity: 800}, lease.Limit{Rate: 600, Burst: 2400, Cost: 1}},
		} {
			m2 := newDryMemory(1024, region, true)
			first, _ = m2.note(key, &c.g, c.l, start, start, limit)
			sent = first + int64(time.Microsecond)
			if until, _ := m2.note(key, &c.g, c.l, sent, sent, limit); until != sent+int64(c.g.RetryAfter) {
				t.Fatalf("%s: hot answer of %+v until %d, want the store's time %d", region, c.g, until, sent+int64(c.g.RetryAfter))
			}
		}
	}
	if phase["us"] == phase["eu"] {
		t.Fatalf("us and eu put the key on the same grid (phase %dns)", phase["us"])
	}
}
