package rlqs

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rig is a Server on the real lease service and memory store, served over
// gRPC on loopback.
type rig struct {
	srv   *Server
	svc   *service.Service
	store *lease.MemoryStore
	reg   *prometheus.Registry
	addr  string
}

func startRig(t *testing.T, tweak func(*Config)) *rig {
	t.Helper()
	store := lease.NewMemoryStore(lease.MemoryConfig{})
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := service.New(service.Config{Region: "eu", Store: store, Policy: mustPolicy(t, testPolicy), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := Config{Leaser: svc, Registerer: reg, Logger: logger}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		g.GracefulStop()
		<-done
	})
	return &rig{srv: srv, svc: svc, store: store, reg: reg, addr: lis.Addr().String()}
}

func (r *rig) stream(t *testing.T) rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient {
	t.Helper()
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); conn.Close() })
	return st
}

func report(domain string, buckets ...map[string]string) *rlqsv3.RateLimitQuotaUsageReports {
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: domain}
	for _, b := range buckets {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: b}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 50})
	}
	return m
}

// recvUntil receives responses until ok holds for one of their actions,
// failing after 10 s.
func recvUntil(t *testing.T, st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, ok func(*rlqsv3.RateLimitQuotaResponse_BucketAction) bool) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	t.Helper()
	got := make(chan *rlqsv3.RateLimitQuotaResponse_BucketAction, 1)
	errc := make(chan error, 1)
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			for _, a := range resp.GetBucketAction() {
				if ok(a) {
					got <- a
					return
				}
			}
		}
	}()
	select {
	case a := <-got:
		return a
	case err := <-errc:
		t.Fatalf("stream ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no such action within 10s")
	}
	return nil
}

func anyAction(*rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return true }

// TestAssignmentIsPreDebited subscribes one bucket: its first assignment
// is a token bucket in whole seconds with a TTL, and the store was debited
// its capacity and refills until TTL + slack before it was sent.
func TestAssignmentIsPreDebited(t *testing.T) {
	r := startRig(t, nil)
	st := r.stream(t)
	if err := st.Send(report("edge", map[string]string{"tenant": "acme", "route": "/a"})); err != nil {
		t.Fatal(err)
	}
	a := recvUntil(t, st, anyAction)
	qa := a.GetQuotaAssignmentAction()
	tb := qa.GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || qa.GetAssignmentTimeToLive().AsDuration() != 2*time.Second || tb.GetFillInterval().AsDuration() != time.Second {
		t.Fatalf("got %v, want a token bucket, fill 1s, TTL 2s", a)
	}
	if a.GetBucketId().GetBucket()["tenant"] != "acme" {
		t.Fatalf("bucket id %v", a.GetBucketId())
	}
	// 50 requests at once ask for 55 per fill with a capacity of 28, which
	// costs 28 + 55 × 2.5; the region's bucket holds 100 (the rule's
	// burst), which pays for 33 per fill: 17 + 33 × 2.5 ≤ 100.
	want := float64(tb.GetMaxTokens()) + float64(tb.GetTokensPerFill().GetValue())*2.5
	if tb.GetTokensPerFill().GetValue() != 33 || tb.GetMaxTokens() != 17 {
		t.Fatalf("strategy %v, want 33 per fill, capacity 17", tb)
	}
	if got := testutil.ToFloat64(r.srv.met.debited); got < want {
		t.Fatalf("debited %v before sending, want at least %v", got, want)
	}
}

// TestBadReports: a stream's first report without a domain, a report of
// another domain and one with too many usages end the stream with
// InvalidArgument; bad usages are ignored and counted; a bucket no rule
// applies to is allowed.
func TestBadReports(t *testing.T) {
	r := startRig(t, func(c *Config) { c.MaxBuckets = 5 })
	for _, tc := range []struct {
		name string
		msgs []*rlqsv3.RateLimitQuotaUsageReports
	}{
		{"no domain", []*rlqsv3.RateLimitQuotaUsageReports{report("", map[string]string{"tenant": "a"})}},
		{"another domain", []*rlqsv3.RateLimitQuotaUsageReports{report("edge"), report("other")}},
		{"too many usages", []*rlqsv3.RateLimitQuotaUsageReports{report("edge", map[string]string{"a": "1"}, map[string]string{"a": "2"},
			map[string]string{"a": "3"}, map[string]string{"a": "4"}, map[string]string{"a": "5"}, map[string]string{"a": "6"})}},
	} {
		st := r.stream(t)
		for _, m := range tc.msgs {
			_ = st.Send(m)
		}
		var err error
		for err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", tc.name, err)
		}
	}

	st := r.stream(t)
	m := report("edge", map[string]string{}, map[string]string{"tenant": "acme", "": "x"})
	m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}, NumRequestsAllowed: 1 << 62})
	m.BucketQuotaUsages = append(m.BucketQuotaUsages, report("x", map[string]string{"nobody": "matches"}).BucketQuotaUsages...)
	if err := st.Send(m); err != nil {
		t.Fatal(err)
	}
	a := recvUntil(t, st, anyAction)
	if a.GetBucketId().GetBucket()["nobody"] != "matches" ||
		a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL {
		t.Fatalf("got %v, want ALLOW_ALL for the bucket no rule applies to", a)
	}
	for label, want := range map[string]float64{badEmptyID: 1, badEntry: 1, badCount: 1} {
		if got := testutil.ToFloat64(r.srv.met.invalid.WithLabelValues(label)); got != want {
			t.Errorf("invalid %s: %v, want %v", label, got, want)
		}
	}
}

// TestShutdownExpiresEveryBucket: Shutdown sends TTL 0 for every bucket
// and ends the stream.
func TestShutdownExpiresEveryBucket(t *testing.T) {
	r := startRig(t, nil)
	st := r.stream(t)
	if err := st.Send(report("edge", map[string]string{"tenant": "a", "route": "/"}, map[string]string{"tenant": "b", "route": "/"})); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, st, anyAction)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() { _ = r.srv.Shutdown(ctx) }()
	zero := map[string]bool{}
	for len(zero) < 2 {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("stream ended with %v after TTL 0 for %v", err, zero)
		}
		for _, a := range resp.GetBucketAction() {
			if qa := a.GetQuotaAssignmentAction(); qa != nil && qa.GetAssignmentTimeToLive().AsDuration() == 0 {
				zero[a.GetBucketId().GetBucket()["tenant"]] = true
			}
		}
	}
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("after TTL 0: got %v, want Unavailable", err)
	}
}

// TestIdleBucketIsAbandoned: a bucket with no request for IdleAfter gets
// abandon_action, and its unused tokens go back to the store.
func TestIdleBucketIsAbandoned(t *testing.T) {
	r := startRig(t, func(c *Config) { c.IdleAfter = time.Second })
	st := r.stream(t)
	if err := st.Send(report("edge", map[string]string{"tenant": "a", "route": "/"})); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, st, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return a.GetAbandonAction() != nil })
}

// TestPolicyChangeMovesBuckets: a policy reloaded with the same rule keeps
// a bucket on its key; a policy whose rule for it has another name moves
// it: its next assignments are leased from the new rule's key.
func TestPolicyChangeMovesBuckets(t *testing.T) {
	r := startRig(t, nil)
	st := r.stream(t)
	bucket := map[string]string{"tenant": "a", "route": "/"}
	m := report("edge", bucket)
	m.BucketQuotaUsages[0].NumRequestsAllowed = 1
	if err := st.Send(m); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, st, anyAction)
	newKey := "edge-renamed/tenant=a,route=/"
	r.svc.SetPolicy(mustPolicy(t, testPolicy))
	if _, ok, err := r.store.Peek(context.Background(), newKey, lease.Limit{Rate: 100, Burst: 100, Cost: 1, InitialShare: 1_000_000}); err != nil || ok {
		t.Fatalf("the renamed rule's key exists before the rename: %v, %v", ok, err)
	}
	r.svc.SetPolicy(mustPolicy(t, strings.Replace(testPolicy, "name: edge-tenant", "name: edge-renamed", 1)))
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, ok, err := r.store.Peek(context.Background(), newKey, lease.Limit{Rate: 100, Burst: 100, Cost: 1, InitialShare: 1_000_000})
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the bucket was not leased from the renamed rule's key within 10s")
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not a wait for an event
	}
}
