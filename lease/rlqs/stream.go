package rlqs

import (
	"context"
	"errors"
	"io"
	"strconv"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// maxItems is the most items one lease call carries (the lease service's
// default MaxItems).
const maxItems = 1000

// maxKeyLen is the longest rule key leased (the lease service's default
// MaxKeyLen): a longer one would fail the whole batch.
const maxKeyLen = 1024

// stream is one proxy's stream: its buckets, owned by the stream's
// handler goroutine.
type stream struct {
	s      *Server
	srv    rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer
	agent  *leasev1.Agent
	domain string
	quotas map[string]*quota
	last   time.Time // the last tick
}

// StreamRateLimitQuotas implements rlqsv3.RateLimitQuotaServiceServer.
func (s *Server) StreamRateLimitQuotas(srv rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	if !s.enter() {
		return status.Error(codes.Unavailable, "rlqs: shutting down")
	}
	defer s.wg.Done()
	s.met.streams.Inc()
	defer s.met.streams.Dec()
	ctx := srv.Context()
	st := &stream{s: s, srv: srv, quotas: map[string]*quota{}, last: s.cfg.Clock(),
		agent: &leasev1.Agent{Id: "rlqs/" + strconv.FormatUint(s.seq.Add(1), 10)}}
	defer st.release()

	// Recv blocks, so a goroutine reads; it ends when the stream does,
	// which is at the latest when this handler returns.
	reports := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	recvErr := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			m, err := srv.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reports <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	tick := time.NewTicker(s.cfg.KeepAlive)
	defer tick.Stop()
	for {
		select {
		case m := <-reports:
			if err := st.report(ctx, m); err != nil {
				return err
			}
		case <-tick.C:
			if err := st.tick(ctx); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-s.done:
			st.expire()
			return status.Error(codes.Unavailable, "rlqs: server shutting down")
		}
	}
}

// report checks and counts one usage report, and answers at once for the
// buckets it subscribes. A bad report as a whole (no domain, another
// domain, too many usages) ends the stream with InvalidArgument; a bad
// usage is ignored and counted.
func (st *stream) report(ctx context.Context, m *rlqsv3.RateLimitQuotaUsageReports) error {
	s := st.s
	s.met.reports.Inc()
	switch d := m.GetDomain(); {
	case st.domain == "" && d == "":
		return status.Error(codes.InvalidArgument, "rlqs: domain is required on a stream's first report")
	case st.domain == "":
		st.domain = d
	case d != "" && d != st.domain:
		return status.Errorf(codes.InvalidArgument, "rlqs: domain %q, but the stream's is %q", d, st.domain)
	}
	us := m.GetBucketQuotaUsages()
	if len(us) > s.cfg.MaxBuckets {
		return status.Errorf(codes.InvalidArgument, "rlqs: %d bucket usages, more than %d", len(us), s.cfg.MaxBuckets)
	}
	now := s.cfg.Clock()
	var fresh []*quota
	for _, bu := range us {
		u, bad := decodeUsage(bu, s.lim)
		if bad != "" {
			s.met.invalid.WithLabelValues(bad).Inc()
			continue
		}
		q := st.quotas[u.id]
		if q == nil {
			if len(st.quotas) >= s.cfg.MaxBuckets {
				s.met.invalid.WithLabelValues(badTooMany).Inc()
				continue
			}
			q = &quota{id: u.id, bucket: u.bucket, sampled: now, lastActive: now}
			st.resolve(q)
			st.quotas[u.id] = q
			s.met.buckets.Inc()
			fresh = append(fresh, q)
		}
		q.observe(u, now)
	}
	if len(fresh) == 0 {
		return nil
	}
	return st.serve(ctx, now, fresh)
}

// resolve maps q to its rule and key in the policy in force.
func (st *stream) resolve(q *quota) {
	q.pol = st.s.cfg.Leaser.Policy()
	q.rule, q.key, q.bad = nil, "", ""
	r, key, err := Resolve(q.pol, st.s.cfg.DomainKey, st.domain, q.bucket)
	switch {
	case errors.Is(err, errFixed):
		q.bad = badFixed
	case err != nil:
		// No enforced rule: ration sets no limit (ALLOW_ALL).
	case len(key) > maxKeyLen:
		q.bad = badKeyTooLong
	default:
		q.rule, q.key = r, key
	}
	if q.rule != nil {
		if sk := policy.StoreKey(r.Name, key); sk != q.storeKey {
			st.s.fair.set(q.storeKey, q.counted, 0)
			q.storeKey, q.counted = sk, 0
		}
	}
	if q.bad != "" {
		st.s.met.invalid.WithLabelValues(q.bad).Inc()
	}
}

// tick abandons idle buckets, follows policy changes and sends every
// bucket's keep-alive or new assignment.
func (st *stream) tick(ctx context.Context) error {
	s := st.s
	now := s.cfg.Clock()
	elapsed := now.Sub(st.last)
	st.last = now
	pol := s.cfg.Leaser.Policy()
	var acts []*rlqsv3.RateLimitQuotaResponse_BucketAction
	var rets []*quota
	qs := make([]*quota, 0, len(st.quotas))
	for id, q := range st.quotas {
		if now.Sub(q.lastActive) > s.cfg.IdleAfter {
			acts = st.add(acts, q, action{kind: actAbandon})
			rets = append(rets, q)
			s.fair.set(q.storeKey, q.counted, 0)
			delete(st.quotas, id)
			s.met.buckets.Dec()
			continue
		}
		if q.pol != pol {
			old, oldKey := q.rule, q.key
			st.resolve(q)
			if (q.rule == nil) != (old == nil) || q.rule != nil && q.rule.Name != old.Name || q.key != oldKey {
				// Another rule or key: what was debited for the old one goes
				// back to it; the proxy's refills paid stand until they end.
				if q.bank > 0 && old != nil {
					st.giveBack(ctx, []retItem{{rule: old.Name, key: oldKey, tokens: q.bank}})
				}
				q.bank, q.active = 0, strategy{}
			}
		}
		if q.rule != nil {
			// Added to what a failed call did not tell.
			d, a := q.tally(elapsed)
			q.tallyDemand, q.tallyAllowed = q.tallyDemand+d, q.tallyAllowed+a
		}
		qs = append(qs, q)
	}
	st.giveBackBanks(ctx, rets)
	return st.serveWith(ctx, now, qs, acts)
}

// serve plans, leases and sends the actions of qs.
func (st *stream) serve(ctx context.Context, now time.Time, qs []*quota) error {
	return st.serveWith(ctx, now, qs, nil)
}

func (st *stream) serveWith(ctx context.Context, now time.Time, qs []*quota, acts []*rlqsv3.RateLimitQuotaResponse_BucketAction) error {
	s := st.s
	var asks []*quota
	for _, q := range qs {
		switch {
		case q.bad != "":
		case q.rule == nil:
			acts = st.add(acts, q, action{kind: actAllow, ttl: s.z.ttl})
		default:
			keyRate := s.fair.set(q.storeKey, q.counted, q.rate)
			q.counted = q.rate
			s.z.plan(q, now, s.cfg.KeepAlive, keyRate)
			if q.want == 0 && q.tallyDemand > 0 {
				q.want = q.rule.Cost // an item carries demand only with an ask
			}
			if q.want > 0 {
				asks = append(asks, q)
			} else {
				acts = st.add(acts, q, s.z.settle(q, now, 0))
			}
		}
	}
	for len(asks) > 0 {
		n := min(len(asks), maxItems)
		acts = st.lease(ctx, now, asks[:n], acts)
		asks = asks[n:]
	}
	if len(acts) == 0 {
		return nil
	}
	if err := st.srv.Send(&rlqsv3.RateLimitQuotaResponse{BucketAction: acts}); err != nil {
		return err
	}
	return nil
}

// lease asks the lease path for qs's tokens in one call and appends their
// actions. A call refused as a whole for one item (a rule's clients, an
// item the service finds invalid) is retried item by item, so one bucket
// cannot fail the others.
func (st *stream) lease(ctx context.Context, now time.Time, qs []*quota, acts []*rlqsv3.RateLimitQuotaResponse_BucketAction) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	s := st.s
	resp, err := st.call(ctx, qs)
	if err == nil {
		for i, q := range qs {
			acts = st.add(acts, q, st.settle(q, now, resp.GetGrants()[i]))
		}
		return acts
	}
	code := status.Code(err)
	s.met.failures.WithLabelValues(code.String()).Inc()
	if (code == codes.InvalidArgument || code == codes.PermissionDenied) && len(qs) > 1 {
		for _, q := range qs {
			acts = st.lease(ctx, now, []*quota{q}, acts)
		}
		return acts
	}
	for _, q := range qs {
		a := s.z.failed(q)
		if code == codes.InvalidArgument || code == codes.PermissionDenied {
			// Not a failure of the region: this proxy may not have the
			// bucket's tokens.
			s.z.drop(q)
			a = action{kind: actDeny, ttl: s.z.ttl}
		}
		acts = st.add(acts, q, a)
	}
	return acts
}

func (st *stream) call(ctx context.Context, qs []*quota) (*leasev1.LeaseResponse, error) {
	items := make([]*leasev1.LeaseItem, len(qs))
	for i, q := range qs {
		c := q.rule.Cost
		items[i] = &leasev1.LeaseItem{Rule: q.rule.Name, Key: q.key, Want: q.want,
			Demand: q.tallyDemand * c, Admitted: q.tallyAllowed * c}
	}
	cctx, cancel := context.WithTimeout(ctx, st.s.cfg.LeaseTimeout)
	defer cancel()
	resp, err := st.s.cfg.Leaser.Lease(cctx, &leasev1.LeaseRequest{Agent: st.agent, Items: items})
	if err == nil && len(resp.GetGrants()) != len(items) {
		err = status.Errorf(codes.Internal, "rlqs: %d grants for %d items", len(resp.GetGrants()), len(items))
	}
	if err == nil {
		// The demand went with this call; the next one tells the next.
		for _, q := range qs {
			q.tallyDemand, q.tallyAllowed = 0, 0
		}
	}
	return resp, err
}

// settle applies one grant: the region's refill learned, the tokens taken.
func (st *stream) settle(q *quota, now time.Time, g *leasev1.LeaseGrant) action {
	if g.GetRate() > 0 {
		q.regionRate = g.GetRate() / float64(q.rule.Cost)
	}
	q.spare = g.GetRemaining()
	granted := max(0, min(g.GetGranted(), q.want))
	st.s.met.debited.Add(float64(granted))
	return st.s.z.settle(q, now, granted)
}

// expire sends every bucket with an assignment a TTL of 0, so the proxy
// falls back now rather than when the TTL ends.
func (st *stream) expire() {
	var acts []*rlqsv3.RateLimitQuotaResponse_BucketAction
	for _, q := range st.quotas {
		if q.bad != "" {
			continue
		}
		a := action{kind: actAllow}
		switch {
		case q.rule == nil:
		case q.active != (strategy{}):
			a = action{kind: actBucket, strategy: q.active}
		default:
			a = action{kind: actDeny}
		}
		acts = st.add(acts, q, a)
		st.s.met.actions.WithLabelValues("expire").Inc()
	}
	if len(acts) > 0 {
		_ = st.srv.Send(&rlqsv3.RateLimitQuotaResponse{BucketAction: acts})
	}
}

// release, when the stream ends, gives back the tokens debited and not
// given to the proxy. Refills already paid are not given back: the proxy
// may still spend them until its TTL ends.
func (st *stream) release() {
	qs := make([]*quota, 0, len(st.quotas))
	for _, q := range st.quotas {
		qs = append(qs, q)
		st.s.fair.set(q.storeKey, q.counted, 0)
	}
	st.s.met.buckets.Sub(float64(len(st.quotas)))
	// The stream's context is done, but its values (the caller's identity,
	// for a rule's clients) still hold.
	st.giveBackBanks(context.WithoutCancel(st.srv.Context()), qs)
}

type retItem struct {
	rule, key string
	tokens    int64
}

func (st *stream) giveBackBanks(ctx context.Context, qs []*quota) {
	var items []retItem
	for _, q := range qs {
		if q.rule != nil && q.bank > 0 {
			items = append(items, retItem{rule: q.rule.Name, key: q.key, tokens: q.bank})
			q.bank = 0
		}
	}
	st.giveBack(ctx, items)
}

// giveBack credits tokens back to the store; a failure only costs
// utilisation, so it is logged.
func (st *stream) giveBack(ctx context.Context, items []retItem) {
	for len(items) > 0 {
		n := min(len(items), maxItems)
		req := &leasev1.ReturnRequest{Agent: st.agent}
		var total int64
		for _, it := range items[:n] {
			req.Items = append(req.Items, &leasev1.ReturnItem{Rule: it.rule, Key: it.key, Tokens: it.tokens})
			total += it.tokens
		}
		items = items[n:]
		cctx, cancel := context.WithTimeout(ctx, st.s.cfg.LeaseTimeout)
		_, err := st.s.cfg.Leaser.Return(cctx, req)
		cancel()
		if err != nil {
			st.s.cfg.Logger.Warn("rlqs: returning unused tokens failed", "tokens", total, "err", err)
			continue
		}
		st.s.met.returned.Add(float64(total))
	}
}

// add appends q's action a to acts, unless there is nothing to send.
func (st *stream) add(acts []*rlqsv3.RateLimitQuotaResponse_BucketAction, q *quota, a action) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	if a.kind == actNone {
		return acts
	}
	return append(acts, st.encode(q, a))
}

// encode is the wire form of one bucket's action.
func (st *stream) encode(q *quota, a action) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	ba := &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: &rlqsv3.BucketId{Bucket: q.bucket}}
	if a.kind == actAbandon {
		st.s.met.actions.WithLabelValues("abandon").Inc()
		ba.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}
		return ba
	}
	var rs *typev3.RateLimitStrategy
	switch a.kind {
	case actBucket:
		rs = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens:     uint32(min(a.strategy.max, 1<<32-1)),
			TokensPerFill: wrapperspb.UInt32(uint32(min(a.strategy.perFill, 1<<32-1))),
			FillInterval:  durationpb.New(st.s.z.fill),
		}}}
		if a.ttl > 0 {
			st.s.met.actions.WithLabelValues("token_bucket").Inc()
		}
	case actDeny, actAllow:
		rule, label := typev3.RateLimitStrategy_DENY_ALL, "deny_all"
		if a.kind == actAllow {
			rule, label = typev3.RateLimitStrategy_ALLOW_ALL, "allow_all"
		}
		rs = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}
		if a.ttl > 0 {
			st.s.met.actions.WithLabelValues(label).Inc()
		}
	}
	ba.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(a.ttl),
			RateLimitStrategy:    rs,
		}}
	return ba
}
