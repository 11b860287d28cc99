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
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
	leasev1 "github.com/ration-dev/ration/lease/v1"
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

// TestBankHoldsOnlyUpsizeSavings pins docs/RLQS.md's bank term on the
// real lease service: a bucket whose demand jumps from 20/s to 80/s for
// 5 s while another agent drains the region's bucket saves for its larger
// token bucket over many ticks, so tokens debited at t are in an
// assignment sent more than TTL + Slack later (the term is needed); a bank
// never holds more than that saving, need(target), besides the next
// keep-alive's refills; and when the demand falls back and the upsize is
// given up, what the bank held beyond that is returned to the store.
func TestBankHoldsOnlyUpsizeSavings(t *testing.T) {
	r := newCoreRig(t)
	id := map[string]string{"tenant": "a", "route": "/"}
	usage := func(n uint64) *rlqsv3.RateLimitQuotaUsageReports {
		return &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqsv3.BucketId{Bucket: id}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: n}}}
	}
	// An agent leasing 80/s of the key's 100/s while the demand is high
	// (its Key is the bucket's, set below).
	other := &leasev1.LeaseRequest{Agent: &leasev1.Agent{Id: "other"}, Items: []*leasev1.LeaseItem{{Rule: "edge-tenant", Want: 40}}}
	z := r.core.z
	h := z.ttl + z.slack
	var firstSaved, gapped time.Time
	var returned int64
	do := func(out Outbox) { // the round's calls, as the stream makes them
		for {
			for _, rr := range out.Returns {
				for _, it := range rr.GetItems() {
					returned += it.GetTokens()
				}
				if _, err := r.svc.Return(context.Background(), rr); err != nil {
					t.Fatal(err)
				}
			}
			if out.Lease == nil {
				return
			}
			resp, err := r.svc.Lease(context.Background(), out.Lease)
			out = r.core.Leased(resp, err)
		}
	}
	for i := range 80 { // 40 s of ticks
		r.now = r.now.Add(500 * time.Millisecond)
		if i%2 == 0 {
			n := uint64(20)
			if i >= 10 && i < 20 {
				n = 80
			}
			out, err := r.core.Report(r.now, r.svc.Policy(), usage(n))
			if err != nil {
				t.Fatal(err)
			}
			do(out)
		}
		if i >= 10 && i < 30 {
			for _, q := range r.core.quotas {
				other.Items[0].Key = q.key
			}
			_, err := r.svc.Lease(context.Background(), other)
			if err != nil {
				t.Fatal(err)
			}
		}
		do(r.core.Tick(r.now, r.svc.Policy()))
		var q *quota
		for _, q = range r.core.quotas {
		}
		cost := q.rule.Cost
		keep := z.refill(q.active, r.core.cfg.KeepAlive, cost)
		saving := q.upsize && q.active != q.target
		switch {
		case saving && firstSaved.IsZero():
			firstSaved = r.now
		case !saving && !firstSaved.IsZero():
			if r.now.Sub(firstSaved) > h {
				gapped = r.now // a fresh bucket paid with tokens banked more than h ago
			}
			firstSaved = time.Time{}
		}
		if saving && q.bank > z.need(q.target, cost)+keep {
			t.Fatalf("tick %d: bank %d while saving, more than need(target) %d and a keep-alive's %d", i, q.bank, z.need(q.target, cost), keep)
		}
		if !saving && q.bank > keep {
			t.Fatalf("tick %d: bank %d not saving, more than a keep-alive's refills %d", i, q.bank, keep)
		}
	}
	if gapped.IsZero() {
		t.Error("no saving lasted more than TTL + Slack: the test no longer shows the bank term's case")
	}
	if returned == 0 {
		t.Error("the savings of an upsize given up were not returned")
	}
	t.Logf("a fresh bucket paid at %v with tokens banked over more than %v; %d tokens returned", gapped, h, returned)
}
