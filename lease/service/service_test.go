package service

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/lease"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testPolicy = `
rules:
  - name: per-tenant
    key: [tenant]
    limit: 100
    period: 1s
    burst: 200
  - name: costly
    key: [tenant]
    limit: 50
    period: 1s
    burst: 50
    cost: 10
  - name: per-ip
    key: [ip]
    limit: 10
    period: 1s
    scope: region
`

// clock is a manual clock for the memory store.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type fixture struct {
	svc    *Service
	client leasev1.LeaseServiceClient
	clock  *clock
}

func mustPolicy(t *testing.T, doc string) *policy.Set {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// start serves a Service on a loopback port over real gRPC.
func start(t *testing.T, cfg Config) *fixture {
	t.Helper()
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	if cfg.Store == nil {
		cfg.Store = lease.NewMemoryStore(lease.MemoryConfig{Clock: clk.Now})
	}
	if cfg.Region == "" {
		cfg.Region = "eu"
	}
	if cfg.Policy == nil {
		cfg.Policy = mustPolicy(t, testPolicy)
	}
	if cfg.Clock == nil {
		cfg.Clock = clk.Now
	}
	if cfg.StoreTimeout == 0 {
		// The store is in memory and time is the fake clock's: the real
		// deadline only fails calls that a loaded machine (-race, CI)
		// delays past the default 50ms.
		cfg.StoreTimeout = 10 * time.Second
	}
	svc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	svc.Register(g)
	done := make(chan struct{})
	go func() { defer close(done); g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		svc.Close()
		g.GracefulStop()
		<-done
	})
	return &fixture{svc: svc, client: leasev1.NewLeaseServiceClient(conn), clock: clk}
}

func agent(id string) *leasev1.Agent { return &leasev1.Agent{Id: id} }

func (f *fixture) lease(t *testing.T, items ...*leasev1.LeaseItem) *leasev1.LeaseResponse {
	t.Helper()
	resp, err := f.client.Lease(context.Background(), &leasev1.LeaseRequest{Agent: agent("a1"), Items: items})
	if err != nil {
		t.Fatalf("Lease: %v", err)
	}
	return resp
}

func TestLeaseGrantsPartialAndDenied(t *testing.T) {
	f := start(t, Config{})
	resp := f.lease(t,
		&leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 150, Demand: 3, Admitted: 3},
		&leasev1.LeaseItem{Rule: "per-ip", Key: "ip=1.2.3.4", Want: 5},
	)
	type got struct {
		Granted   int64
		Rate, Cap float64
		Limit     int64
		TTL       time.Duration
	}
	var gs []got
	for _, g := range resp.GetGrants() {
		gs = append(gs, got{g.GetGranted(), g.GetRate(), g.GetCapacity(), g.GetLimit(), g.GetTtl().AsDuration()})
	}
	want := []got{
		{Granted: 150, Rate: 100, Cap: 200, Limit: 100, TTL: 100 * time.Millisecond},
		{Granted: 5, Rate: 10, Cap: 10, Limit: 10, TTL: 100 * time.Millisecond},
	}
	if d := cmp.Diff(want, gs); d != "" {
		t.Fatalf("grants (-want +got):\n%s", d)
	}
	if resp.GetRegion() != "eu" || resp.GetAgents() != 1 {
		t.Errorf("got region %q agents %d, want eu 1", resp.GetRegion(), resp.GetAgents())
	}

	// 50 left of 200: a partial grant, then nothing with a retry-after.
	g := f.lease(t, &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 80}).GetGrants()[0]
	if g.GetGranted() != 50 {
		t.Fatalf("got partial grant %d, want 50", g.GetGranted())
	}
	g = f.lease(t, &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 1}).GetGrants()[0]
	if g.GetGranted() != 0 || g.GetRetryAfter().AsDuration() <= 0 || g.GetRetryAfter().AsDuration() > 10*time.Millisecond {
		t.Fatalf("got granted %d retry after %v, want 0 and (0, 10ms]", g.GetGranted(), g.GetRetryAfter().AsDuration())
	}
	// After 100 ms at 100 tokens/s, 10 tokens.
	f.clock.Advance(100 * time.Millisecond)
	g = f.lease(t, &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 100}).GetGrants()[0]
	if g.GetGranted() != 10 {
		t.Fatalf("got %d after refill, want 10", g.GetGranted())
	}
}

func TestLeaseCostGrantsWholeRequests(t *testing.T) {
	f := start(t, Config{})
	g := f.lease(t, &leasev1.LeaseItem{Rule: "costly", Key: "tenant=acme", Want: 45}).GetGrants()[0]
	if g.GetGranted()%10 != 0 || g.GetGranted() > 45 {
		t.Fatalf("got %d, want a multiple of the cost 10 and ≤ 45", g.GetGranted())
	}
}

func TestLeaseRejectsInvalidAndDebitsNothing(t *testing.T) {
	f := start(t, Config{MaxItems: 3})
	good := &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 200}
	cases := []struct {
		name  string
		agent *leasev1.Agent
		items []*leasev1.LeaseItem
		msg   string
	}{
		{"no agent", nil, []*leasev1.LeaseItem{good}, "agent.id is required"},
		{"no items", agent("a"), nil, "no items"},
		{"too many", agent("a"), []*leasev1.LeaseItem{good, good, good, good}, "4 items, more than the 3"},
		{"unknown rule", agent("a"), []*leasev1.LeaseItem{good, {Rule: "nope", Key: "k", Want: 1}}, `items[1].rule: unknown rule "nope"`},
		{"empty key", agent("a"), []*leasev1.LeaseItem{good, {Rule: "per-tenant", Want: 1}}, "items[1].key: empty"},
		{"zero want", agent("a"), []*leasev1.LeaseItem{good, {Rule: "per-tenant", Key: "k", Want: 0}}, "items[1].want: 0, must be > 0"},
		{"negative want", agent("a"), []*leasev1.LeaseItem{good, {Rule: "per-tenant", Key: "k", Want: -5}}, "items[1].want: -5"},
		{"negative demand", agent("a"), []*leasev1.LeaseItem{good, {Rule: "per-tenant", Key: "k", Want: 1, Demand: -1}}, "must not be negative"},
		{"long key", agent("a"), []*leasev1.LeaseItem{good, {Rule: "per-tenant", Key: strings.Repeat("k", 2000), Want: 1}}, "more than 1024"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.client.Lease(context.Background(), &leasev1.LeaseRequest{Agent: tc.agent, Items: tc.items})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("got %v, want InvalidArgument containing %q", err, tc.msg)
			}
		})
	}
	// The valid item in every rejected batch debited nothing: the whole
	// burst is still there.
	if g := f.lease(t, good).GetGrants()[0].GetGranted(); g != 200 {
		t.Fatalf("got %d after rejected batches, want the full burst 200", g)
	}
}

func TestReturnCreditsCappedAtCapacity(t *testing.T) {
	f := start(t, Config{})
	f.lease(t, &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 200})
	ret := func(n int64) error {
		_, err := f.client.Return(context.Background(), &leasev1.ReturnRequest{Agent: agent("a1"),
			Items: []*leasev1.ReturnItem{{Rule: "per-tenant", Key: "tenant=acme", Tokens: n}}})
		return err
	}
	if err := ret(70); err != nil {
		t.Fatal(err)
	}
	if g := f.lease(t, &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 500}).GetGrants()[0].GetGranted(); g != 70 {
		t.Fatalf("got %d after returning 70, want 70", g)
	}
	if err := ret(10_000); err != nil {
		t.Fatal(err)
	}
	if g := f.lease(t, &leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 500}).GetGrants()[0].GetGranted(); g != 200 {
		t.Fatalf("got %d after returning 10000, want capacity 200", g)
	}
	if err := ret(0); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v for 0 tokens, want InvalidArgument", err)
	}
}

func TestWatchPolicyStreamsChanges(t *testing.T) {
	f := start(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := f.client.WatchPolicy(ctx, &leasev1.WatchPolicyRequest{Agent: agent("a1")})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if first.GetVersion() != f.svc.Policy().Version() || first.GetRegion() != "eu" {
		t.Fatalf("got version %q region %q, want %q eu", first.GetVersion(), first.GetRegion(), f.svc.Policy().Version())
	}
	p2 := mustPolicy(t, "rules:\n  - name: only\n    key: [tenant]\n    limit: 5\n")
	f.svc.SetPolicy(p2)
	second, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := policy.Parse("stream", second.GetYaml())
	if err != nil {
		t.Fatalf("streamed policy does not parse: %v", err)
	}
	if parsed.Version() != p2.Version() {
		t.Fatalf("got version %q, want %q", parsed.Version(), p2.Version())
	}
	// The old rule is gone for new leases.
	_, err = f.client.Lease(ctx, &leasev1.LeaseRequest{Agent: agent("a1"), Items: []*leasev1.LeaseItem{{Rule: "per-tenant", Key: "k", Want: 1}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v for a removed rule, want InvalidArgument", err)
	}
	f.svc.Close()
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v after Close, want Unavailable", err)
	}
}

func TestAgentsCountedWithinWindow(t *testing.T) {
	f := start(t, Config{AgentWindow: 10 * time.Second})
	for _, id := range []string{"a", "b", "c", "a"} {
		if _, err := f.client.Lease(context.Background(), &leasev1.LeaseRequest{Agent: agent(id),
			Items: []*leasev1.LeaseItem{{Rule: "per-ip", Key: "ip=" + id, Want: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.svc.Agents(); n != 3 {
		t.Fatalf("got %d agents, want 3", n)
	}
	f.clock.Advance(11 * time.Second)
	if n := f.svc.Agents(); n != 0 {
		t.Fatalf("got %d agents after the window, want 0", n)
	}
}

type observed struct {
	mu   sync.Mutex
	seen map[string][2]int64
}

func (o *observed) Observe(key string, r *policy.Rule, demand, granted int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	v := o.seen[key]
	o.seen[key] = [2]int64{v[0] + demand, v[1] + granted}
}

func TestObserverSeesGlobalKeysOnly(t *testing.T) {
	o := &observed{seen: map[string][2]int64{}}
	f := start(t, Config{Observer: o, InitialShare: region.PPM / 2})
	resp := f.lease(t,
		&leasev1.LeaseItem{Rule: "per-tenant", Key: "tenant=acme", Want: 300, Demand: 40, Admitted: 30},
		&leasev1.LeaseItem{Rule: "per-ip", Key: "ip=1", Want: 1, Demand: 1, Admitted: 1},
	)
	// Half of the global burst is this region's.
	if g := resp.GetGrants()[0]; g.GetGranted() != 100 || g.GetRate() != 50 {
		t.Fatalf("got granted %d rate %v, want 100 and 50 with half the share", g.GetGranted(), g.GetRate())
	}
	want := map[string][2]int64{"per-tenant/tenant=acme": {40, 100}}
	if d := cmp.Diff(want, o.seen); d != "" {
		t.Fatalf("observed (-want +got):\n%s", d)
	}
}

// TestFailedStoreCountsDemand checks that a Lease call whose store fails
// still counts its global items' demand for the exchange, as asks granted
// nothing, and says so in its error (over gRPC), so that the agent does not
// report it again; a call that succeeds says nothing of the kind.
func TestFailedStoreCountsDemand(t *testing.T) {
	o := &observed{seen: map[string][2]int64{}}
	fail := true
	f := start(t, Config{Observer: o, Store: &flakyStore{Store: lease.NewMemoryStore(lease.MemoryConfig{}), fail: &fail}})
	req := &leasev1.LeaseRequest{Agent: agent("a"), Items: []*leasev1.LeaseItem{
		{Rule: "per-tenant", Key: "tenant=acme", Want: 5, Demand: 3, Admitted: 1},
		{Rule: "per-ip", Key: "ip=1", Want: 1, Demand: 1},
	}}
	_, err := f.client.Lease(context.Background(), req)
	if status.Code(err) != codes.Unavailable || !leasev1.DemandCounted(err) {
		t.Fatalf("Lease with a failing store: %v (demand counted %v), want Unavailable with the demand counted", err, leasev1.DemandCounted(err))
	}
	want := map[string][2]int64{"per-tenant/tenant=acme": {3, 0}}
	if d := cmp.Diff(want, o.seen); d != "" {
		t.Fatalf("observed (-want +got):\n%s", d)
	}
	fail = false
	if _, err := f.client.Lease(context.Background(), req); err != nil || leasev1.DemandCounted(err) {
		t.Fatalf("Lease with the store back: %v", err)
	}
	if got := o.seen["per-tenant/tenant=acme"][0]; got != 6 {
		t.Fatalf("demand counted %d after both calls, want 6", got)
	}
}
