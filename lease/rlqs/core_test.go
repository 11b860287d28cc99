package rlqs

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
)

// coreRig is a Core leasing from the real lease service on a memory store,
// all on one virtual clock.
type coreRig struct {
	now  time.Time
	svc  *service.Service
	core *Core
}

func newCoreRig(t *testing.T) *coreRig {
	t.Helper()
	r := &coreRig{now: time.Unix(1_700_000_000, 0)}
	clock := func() time.Time { return r.now }
	store := lease.NewMemoryStore(lease.MemoryConfig{Clock: clock})
	svc, err := service.New(service.Config{Region: "eu", Store: store, Policy: mustPolicy(t, testPolicy),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	r.svc = svc
	var fair Fair
	if r.core, err = NewCore(Config{}, &fair, "rlqs/test", r.now); err != nil {
		t.Fatal(err)
	}
	return r
}

// carry makes the Outbox's calls on the service, as the stream does, and
// returns the round's response.
func (r *coreRig) carry(t *testing.T, out Outbox) (*rlqsv3.RateLimitQuotaResponse, int64) {
	t.Helper()
	var granted int64
	for out.Lease != nil {
		resp, err := r.svc.Lease(context.Background(), out.Lease)
		for _, g := range resp.GetGrants() {
			granted += g.GetGranted()
		}
		out = r.core.Leased(resp, err)
	}
	return out.Response, granted
}

// TestCoreRound: a subscribing report is answered in one round, a token
// bucket in whole seconds whose capacity and refills until TTL + Slack
// were leased before it is sent; keep-alive ticks resend it.
func TestCoreRound(t *testing.T) {
	r := newCoreRig(t)
	id := map[string]string{"tenant": "a", "route": "/"}
	out, err := r.core.Report(r.now, r.svc.Policy(), report("edge", id))
	if err != nil {
		t.Fatal(err)
	}
	if out.Lease == nil || len(out.Lease.GetItems()) != 1 || out.Lease.GetItems()[0].GetRule() != "edge-tenant" {
		t.Fatalf("got outbox %v, want one lease item of rule edge-tenant", out)
	}
	resp, granted := r.carry(t, out)
	acts := resp.GetBucketAction()
	if len(acts) != 1 {
		t.Fatalf("got %d actions, want 1", len(acts))
	}
	qa := acts[0].GetQuotaAssignmentAction()
	tb := qa.GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || qa.GetAssignmentTimeToLive().AsDuration() != 2*time.Second || tb.GetFillInterval().AsDuration() != time.Second {
		t.Fatalf("got %v, want a token bucket, fill_interval 1s, TTL 2s", qa)
	}
	spend := int64(tb.GetMaxTokens()) + (int64(tb.GetTokensPerFill().GetValue())*5+1)/2 // max + 2.5 s of refills
	if spend > granted {
		t.Errorf("the proxy may spend %d without asking, %d were leased", spend, granted)
	}
	for i := range 4 {
		r.now = r.now.Add(500 * time.Millisecond)
		resp, _ := r.carry(t, r.core.Tick(r.now, r.svc.Policy()))
		a := resp.GetBucketAction()
		if len(a) != 1 || a[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() < time.Second {
			t.Fatalf("tick %d: got %v, want the bucket's assignment with a TTL", i, resp)
		}
	}
}

// TestCoreSplitsARefusedBatch: a lease call refused as a whole is made
// again item by item, and an item refused alone gets DENY_ALL.
func TestCoreSplitsARefusedBatch(t *testing.T) {
	r := newCoreRig(t)
	out, err := r.core.Report(r.now, r.svc.Policy(), report("edge", map[string]string{"tenant": "a", "route": "/"}, map[string]string{"tenant": "b", "route": "/"}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(out.Lease.GetItems()); n != 2 {
		t.Fatalf("got %d items, want 2 in one call", n)
	}
	denied := status.Error(codes.PermissionDenied, "not yours")
	out = r.core.Leased(nil, denied)
	for i := range 2 {
		if out.Lease == nil || len(out.Lease.GetItems()) != 1 {
			t.Fatalf("call %d after the refusal: got %v, want one item", i, out.Lease)
		}
		out = r.core.Leased(nil, denied)
	}
	acts := out.Response.GetBucketAction()
	if len(acts) != 2 {
		t.Fatalf("got %d actions, want 2", len(acts))
	}
	for _, a := range acts {
		if a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule().String() != "DENY_ALL" {
			t.Errorf("got %v, want DENY_ALL", a)
		}
	}
}

// TestCoreOneRoundAtATime: a round begun before the last ended is the
// caller's bug, and panics.
func TestCoreOneRoundAtATime(t *testing.T) {
	r := newCoreRig(t)
	if _, err := r.core.Report(r.now, r.svc.Policy(), report("edge", map[string]string{"tenant": "a", "route": "/"})); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Error("Tick during a round did not panic")
		}
	}()
	r.core.Tick(r.now, r.svc.Policy())
}
