package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ration-dev/ration/lease"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
)

// batch is the per-call scratch space, pooled so that a steady stream of
// lease calls does not allocate its slices anew each time.
type batch struct {
	rules  []*policy.Rule
	keys   []string
	grants []lease.GrantRequest
	out    []lease.Grant
	rets   []lease.ReturnRequest
	buf    []byte
	// The grants that go to the store (those of keys not remembered dry),
	// their answers, and their indices in grants.
	send    []lease.GrantRequest
	sendOut []lease.Grant
	sendIdx []int
	// Items waiting for another call's answer for their key, and its
	// channel.
	waitIdx []int
	waitCh  []chan struct{}
}

func (s *Service) getBatch(n int) *batch {
	b := s.bufs.Get().(*batch)
	b.rules = b.rules[:0]
	b.keys = b.keys[:0]
	b.grants = b.grants[:0]
	b.rets = b.rets[:0]
	b.send, b.sendIdx = b.send[:0], b.sendIdx[:0]
	if cap(b.out) < n {
		b.out = make([]lease.Grant, n)
	}
	b.out = b.out[:n]
	return b
}

func (s *Service) putBatch(b *batch) {
	clear(b.rules[:cap(b.rules)])
	clear(b.keys[:cap(b.keys)])
	clear(b.grants[:cap(b.grants)])
	clear(b.rets[:cap(b.rets)])
	clear(b.send[:cap(b.send)])
	clear(b.waitCh[:cap(b.waitCh)])
	s.bufs.Put(b)
}

// limitFor is the allocator's view of rule r for key in this region at now.
func (s *Service) limitFor(key string, r *policy.Rule, now time.Time) lease.Limit {
	share := s.cfg.InitialShare
	if s.cfg.InitialShareFor != nil && r.Scope != policy.ScopeRegion {
		share = s.cfg.InitialShareFor(key, r)
	}
	return Limit(r, share, now)
}

// Limit is the allocator's view of rule r in a region whose initial share of
// the rule's global keys is initialShare: the rule's rate, burst and cost,
// and the share a key holds before the exchange moves any (region.PPM for a
// `scope: region` rule). A nil rule (a key whose rule left the policy) gets
// a limit of one token: writing its share then only clips its bucket, which
// nobody can lease from anyway. A fixed-window rule's limit carries the
// window boundaries around now (policy.Rule.Boundaries); the store uses the
// window its own clock is in. lease/service, sync/exchange and the
// simulator all build limits with it.
func Limit(r *policy.Rule, initialShare int64, now time.Time) lease.Limit {
	if r == nil {
		return lease.Limit{Rate: 1, Burst: 1, Cost: 1, InitialShare: initialShare}
	}
	if r.Scope == policy.ScopeRegion {
		initialShare = region.PPM
	}
	l := lease.Limit{
		Rate:         r.Rate(),
		Burst:        float64(r.Burst),
		Cost:         r.Cost,
		InitialShare: initialShare,
		StartEmpty:   r.StartEmpty,
	}
	if r.FixedWindow() {
		l.Window = r.Boundaries(now)
	}
	return l
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// checkBatch validates what every call shares: the agent and the batch size.
func (s *Service) checkBatch(agent *leasev1.Agent, n int) error {
	if agent.GetId() == "" {
		return invalid("agent.id is required")
	}
	if len(agent.GetId()) > 256 {
		return invalid("agent.id is longer than 256 bytes")
	}
	if n == 0 {
		return invalid("no items")
	}
	if n > s.cfg.MaxItems {
		return invalid("%d items, more than the %d one call may carry", n, s.cfg.MaxItems)
	}
	return nil
}

// checkItem validates the rule and key of item i and returns its rule.
func (s *Service) checkItem(pol *policy.Set, i int, rule, key string) (*policy.Rule, error) {
	if pol == nil {
		return nil, status.Errorf(codes.Unavailable, "region has no policy loaded yet")
	}
	r := pol.Rule(rule)
	if r == nil {
		return nil, invalid("items[%d].rule: unknown rule %q", i, rule)
	}
	if key == "" {
		return nil, invalid("items[%d].key: empty", i)
	}
	if len(key) > s.cfg.MaxKeyLen {
		return nil, invalid("items[%d].key: %d bytes, more than %d", i, len(key), s.cfg.MaxKeyLen)
	}
	return r, nil
}

// storeError maps a store failure to a gRPC status. Every failure to reach
// the store in time is Unavailable, so that agents apply their failure mode.
func storeError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, lease.ErrInvalid):
		return status.Errorf(codes.InvalidArgument, "%v", err)
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled):
		return status.Errorf(codes.Canceled, "%v", err)
	default:
		return status.Errorf(codes.Unavailable, "region store: %v", err)
	}
}

// Lease implements leasev1.LeaseServiceServer. A batch with any invalid item
// is rejected whole, before the store is called, so it debits nothing.
func (s *Service) Lease(ctx context.Context, req *leasev1.LeaseRequest) (*leasev1.LeaseResponse, error) {
	items := req.GetItems()
	if err := s.checkBatch(req.GetAgent(), len(items)); err != nil {
		s.metrics.lease.invalid.Inc()
		return nil, err
	}
	b := s.getBatch(len(items))
	defer s.putBatch(b)
	now := s.cfg.Clock()
	if err := s.leaseBatch(b, items, now); err != nil {
		s.metrics.lease.invalid.Inc()
		s.metrics.invalidItem.Add(float64(len(items)))
		return nil, err
	}
	if err := s.authorize(ctx, "lease", b.rules); err != nil {
		return nil, err
	}
	s.agents.saw(req.GetAgent().GetId(), now)
	if err := s.grantBatch(ctx, b, now); err != nil {
		return nil, s.leaseFailed(ctx, b, items, err)
	}
	resp := &leasev1.LeaseResponse{
		Grants: make([]*leasev1.LeaseGrant, len(items)),
		Agents: int32(min(s.agents.count(now), 1<<31-1)),
		Region: s.cfg.Region,
	}
	s.grants(resp, b, items, now)
	s.metrics.lease.ok.Inc()
	return resp, nil
}

// leaseFailed returns the error of a Lease call whose store failed. The
// items' demand is real whatever the store did, so it is counted for the
// exchange, as asks granted nothing, and the error says so
// (leasev1.ReasonDemandCounted): the agent does not report it again.
// Otherwise the demand waited at the agent for the key's next request, and
// a key asked once in a while whose call met a failing store had no demand
// in any region until then: the exchange retired it as idle, and entered it
// again at that request (docs/DESIGN.md, "Demand of failed calls"). It is
// counted too when the caller gave up on the call (its deadline passed),
// though that agent, which never sees the error, reports the demand again
// with the key's next call: one request counted twice costs the exchange
// less than a key retired and entered again.
func (s *Service) leaseFailed(ctx context.Context, b *batch, items []*leasev1.LeaseItem, err error) error {
	if s.cfg.Observer == nil || status.Code(err) == codes.InvalidArgument {
		return err
	}
	for i, r := range b.rules {
		if r.Scope != policy.ScopeRegion {
			s.cfg.Observer.Observe(b.keys[i], r, items[i].GetDemand(), 0)
		}
	}
	return leasev1.DemandCountedError(status.Code(err), status.Convert(err).Message())
}

// grantBatch fills b.out: from the memory of dry keys where it holds the
// key, from the store for the rest, which it remembers. An ask for a key
// that other asks are on their way to the store for, and that what they
// leave may not cover, waits for their answer and decides again (one store
// operation for a herd of asks), but only after this call's own asks are
// answered, so that no call waits for one that waits for it. Asks waiting
// this way end: each answer either leaves the key dry (answered from
// memory) or tells what the bucket holds.
func (s *Service) grantBatch(ctx context.Context, b *batch, now time.Time) error {
	b.waitIdx, b.waitCh = b.waitIdx[:0], b.waitCh[:0]
	for i := range b.grants {
		s.decideItem(b, i, now)
	}
	for {
		if err := s.sendGrants(ctx, b); err != nil {
			return err
		}
		if len(b.waitIdx) == 0 {
			return nil
		}
		// Every wait ends before any item decides again: a call waits
		// only while it has no ask of its own in flight.
		for _, ch := range b.waitCh {
			select {
			case <-ch:
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
		}
		b.send, b.sendIdx = b.send[:0], b.sendIdx[:0]
		idx := b.waitIdx
		b.waitIdx, b.waitCh = nil, nil
		now := s.cfg.Clock()
		for _, i := range idx {
			s.decideItem(b, i, now)
		}
	}
}

// decideItem answers item i from the memory of dry keys, or puts it on b's
// waits (the asks in flight for its key may leave it nothing), or on the
// asks to send.
func (s *Service) decideItem(b *batch, i int, now time.Time) {
	if s.fromMemory(b, i, now) {
		b.send = append(b.send, b.grants[i])
		b.sendIdx = append(b.sendIdx, i)
	}
}

// fromMemory answers item i from the memory of dry keys, or puts it on
// b's waits, and reports whether it is left to send.
func (s *Service) fromMemory(b *batch, i int, now time.Time) bool {
	at := now.UnixNano()
	d, dry, wait, probe := s.dry.claim(b.keys[i], b.grants[i].Want, b.grants[i].Limit.Cost, at)
	if probe {
		s.metrics.dryProbes.Inc()
		s.probeItems.Add(1)
	}
	switch {
	case dry:
		b.out[i] = lease.Grant{RetryAfter: time.Duration(d.until - at), Rate: d.rate, Capacity: d.capacity}
		s.metrics.dryAnswers.Inc()
		return false
	case wait != nil:
		b.waitIdx, b.waitCh = append(b.waitIdx, i), append(b.waitCh, wait)
		if s.joined != nil {
			s.joined()
		}
		return false
	}
	return true
}

// sendGrants asks the store for b.send, fills their answers in b.out and
// notes them in the memory, ending their flights.
func (s *Service) sendGrants(ctx context.Context, b *batch) error {
	if len(b.send) == 0 {
		return nil
	}
	if cap(b.sendOut) < len(b.send) {
		b.sendOut = make([]lease.Grant, len(b.send))
	}
	out := b.sendOut[:len(b.send)]
	sctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	sent := s.cfg.Clock().UnixNano()
	start := time.Now()
	err := s.cfg.Store.Grant(sctx, b.send, out)
	cancel()
	s.metrics.lease.latency.Observe(time.Since(start).Seconds())
	s.metrics.grantItems.Add(float64(len(b.send)))
	s.grantItems.Add(int64(len(b.send)))
	done := s.cfg.Clock().UnixNano()
	for j, i := range b.sendIdx {
		if err == nil {
			b.out[i] = out[j]
			if until, dry := s.dry.note(b.keys[i], &out[j], b.grants[i].Limit, sent, done, s.dryFor(b.rules[i])); dry {
				s.announce(b.rules[i], b.keys[i], until)
				if out[j].Granted == 0 {
					// The memory denies until then, which may be after the
					// store's hint (phaseDelay): asking sooner only meets it.
					b.out[i].RetryAfter = max(b.out[i].RetryAfter, time.Duration(until-done))
				}
			}
		}
		known := err == nil && out[j].Err == nil
		s.dry.land(b.keys[i], b.send[j].Want, out[j].Tokens, known, done, s.dryFor(b.rules[i]))
	}
	if err != nil {
		s.metrics.lease.storeErrors.Inc()
		s.metrics.lease.storeError.Inc()
		return storeError(ctx, err)
	}
	return nil
}

// dryFor is how long a dry key of rule r may be remembered.
func (s *Service) dryFor(r *policy.Rule) time.Duration {
	if r.Scope != policy.ScopeRegion && s.cfg.ShareRetryAfter > 0 {
		return min(s.cfg.DryFor, s.cfg.ShareRetryAfter)
	}
	return s.cfg.DryFor
}

// leaseBatch validates every item and fills b with its rule, store key and
// grant request.
func (s *Service) leaseBatch(b *batch, items []*leasev1.LeaseItem, now time.Time) error {
	pol := s.Policy()
	for i, it := range items {
		r, err := s.checkItem(pol, i, it.GetRule(), it.GetKey())
		if err != nil {
			return err
		}
		switch {
		case it.GetWant() <= 0:
			return invalid("items[%d].want: %d, must be > 0", i, it.GetWant())
		case it.GetWant() < r.Cost:
			return invalid("items[%d].want: %d, below rule %s's cost %d", i, it.GetWant(), r.Name, r.Cost)
		case it.GetDemand() < 0 || it.GetAdmitted() < 0:
			return invalid("items[%d]: demand and admitted must not be negative", i)
		case it.GetAdmitted() > it.GetDemand():
			return invalid("items[%d].admitted: %d, more than demand %d", i, it.GetAdmitted(), it.GetDemand())
		}
		b.buf = policy.AppendStoreKey(b.buf[:0], r.Name, it.GetKey())
		key := string(b.buf)
		b.rules = append(b.rules, r)
		b.keys = append(b.keys, key)
		b.grants = append(b.grants, lease.GrantRequest{Key: key, Want: it.GetWant(), Limit: s.limitFor(key, r, now)})
	}
	return nil
}

// grants turns the store's answers in b into resp's grants, counts them and
// tells the exchange the demand and grants of global keys.
func (s *Service) grants(resp *leasev1.LeaseResponse, b *batch, items []*leasev1.LeaseItem, now time.Time) {
	ttl := durationpb.New(s.cfg.LeaseTTL)
	var granted int64
	for i, g := range b.out {
		r := b.rules[i]
		lg := &leasev1.LeaseGrant{
			Granted:   g.Granted,
			Ttl:       s.leaseTTL(b.grants[i].Limit, now, ttl),
			Rate:      g.Rate,
			Capacity:  g.Capacity,
			Remaining: g.Tokens,
			Limit:     r.Limit,
			Period:    durationpb.New(r.Period),
		}
		switch {
		case g.Err != nil:
			// Policy validation makes this unreachable; if a store still
			// refuses an item, the agent sees a plain denial.
			s.cfg.Logger.Error("store rejected a validated item", "key", b.keys[i], "err", g.Err)
			s.metrics.invalidItem.Inc()
			lg.Granted = 0
		case g.Granted == 0:
			ra := g.RetryAfter
			if r.Scope != policy.ScopeRegion && s.cfg.ShareRetryAfter > 0 {
				// The share, and with it the refill, may rise every
				// sync period: an agent that waited for the store's
				// hint would hide its demand from the exchange.
				ra = min(ra, s.cfg.ShareRetryAfter)
			}
			lg.RetryAfter = durationpb.New(ra)
			s.metrics.denied.Inc()
		case g.Granted < items[i].GetWant():
			s.metrics.partial.Inc()
		default:
			s.metrics.granted.Inc()
		}
		granted += lg.Granted
		resp.Grants[i] = lg
		s.noteItem(now, r, b.keys[i], items[i], lg.Granted)
		if s.cfg.Observer != nil && r.Scope != policy.ScopeRegion {
			s.cfg.Observer.Observe(b.keys[i], r, items[i].GetDemand(), lg.Granted)
		}
		if r.IsStaged() {
			if d := items[i].GetDemand() - items[i].GetAdmitted(); d > 0 {
				s.metrics.stagedDenied.WithLabelValues(r.Name).Add(float64(d))
			}
		}
	}
	s.metrics.tokensGranted.Add(float64(granted))
}

// leaseTTL is how long a lease of limit l granted at now may be spent: τ,
// and never past the end of a fixed window (a window's tokens are its own;
// l.Window[2] is the end of the window holding now).
func (s *Service) leaseTTL(l lease.Limit, now time.Time, ttl *durationpb.Duration) *durationpb.Duration {
	if !l.Fixed() {
		return ttl
	}
	if left := time.Duration(l.Window[2]-now.UnixMicro()) * time.Microsecond; left < s.cfg.LeaseTTL {
		return durationpb.New(left)
	}
	return ttl
}

// staleReturn reports whether tokens returned at now under limit l may come
// from a lease of the fixed window before, which ended less than τ ago
// (l.Window[1] is the start of the window holding now): crediting them to
// the new window would create tokens, so they are dropped.
func (s *Service) staleReturn(l lease.Limit, now time.Time) bool {
	return l.Fixed() && time.Duration(now.UnixMicro()-l.Window[1])*time.Microsecond < s.cfg.LeaseTTL
}

// Return implements leasev1.LeaseServiceServer.
func (s *Service) Return(ctx context.Context, req *leasev1.ReturnRequest) (*leasev1.ReturnResponse, error) {
	items := req.GetItems()
	if err := s.checkBatch(req.GetAgent(), len(items)); err != nil {
		s.metrics.ret.invalid.Inc()
		return nil, err
	}
	pol := s.Policy()
	b := s.getBatch(0)
	defer s.putBatch(b)
	now := s.cfg.Clock()
	var total int64
	for i, it := range items {
		r, err := s.checkItem(pol, i, it.GetRule(), it.GetKey())
		if err == nil && it.GetTokens() <= 0 {
			err = invalid("items[%d].tokens: %d, must be > 0", i, it.GetTokens())
		}
		if err != nil {
			s.metrics.ret.invalid.Inc()
			return nil, err
		}
		b.buf = policy.AppendStoreKey(b.buf[:0], r.Name, it.GetKey())
		key := string(b.buf)
		l := s.limitFor(key, r, now)
		if s.staleReturn(l, now) {
			s.metrics.staleReturns.Add(float64(it.GetTokens()))
			continue
		}
		b.rules = append(b.rules, r)
		b.rets = append(b.rets, lease.ReturnRequest{Key: key, Tokens: it.GetTokens(), Limit: l})
		total += it.GetTokens()
		s.dry.forget(key)
	}
	if err := s.authorize(ctx, "return", b.rules); err != nil {
		return nil, err
	}
	s.agents.saw(req.GetAgent().GetId(), now)
	sctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	start := time.Now()
	err := s.cfg.Store.Return(sctx, b.rets)
	cancel()
	s.metrics.returnItems.Add(float64(len(b.rets)))
	s.returnItems.Add(int64(len(b.rets)))
	s.metrics.ret.latency.Observe(time.Since(start).Seconds())
	if err != nil {
		s.metrics.ret.storeErrors.Inc()
		s.metrics.ret.storeError.Inc()
		return nil, storeError(ctx, err)
	}
	s.metrics.tokensReturned.Add(float64(total))
	s.metrics.ret.ok.Inc()
	return &leasev1.ReturnResponse{}, nil
}

// WatchPolicy implements leasev1.LeaseServiceServer: the current policy at
// once, then every change, until the client goes away or Close.
func (s *Service) WatchPolicy(req *leasev1.WatchPolicyRequest, stream leasev1.LeaseService_WatchPolicyServer) error {
	if req.GetAgent().GetId() == "" {
		return invalid("agent.id is required")
	}
	ctx := stream.Context()
	var sent *policy.Set
	for {
		pol, changed := s.policyAndChange()
		if pol != nil && pol != sent {
			snap := &leasev1.PolicySnapshot{Version: pol.Version(), Yaml: pol.Source(), Region: s.cfg.Region}
			if err := stream.Send(snap); err != nil {
				return fmt.Errorf("service: sending policy: %w", err)
			}
			sent = pol
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.closed:
			return status.Error(codes.Unavailable, "region is shutting down")
		}
	}
}
