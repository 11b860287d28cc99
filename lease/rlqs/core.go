package rlqs

import (
	"errors"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// Core is one proxy stream's decisions, with no I/O: it ingests usage
// reports, plans every bucket's assignment, says which lease and return
// calls to make, and turns their answers into the response to send. Time
// and the policy in force are arguments. The server's stream handler and
// the simulator both drive it; they carry out its calls and deliver its
// responses, in the order given.
//
// A round begins with Report or Tick and goes on while the Outbox it
// returns has a Lease: the caller makes that call and passes the answer to
// Leased, which returns the next Outbox. A round must end before the next
// begins. A Core is not safe for concurrent use; the Fair it shares with
// the server's other streams is.
type Core struct {
	cfg   Config
	z     sizing
	lim   limits
	met   *metrics
	fair  *Fair
	agent *leasev1.Agent

	domain string
	quotas map[string]*quota
	last   time.Time // the last tick

	// The round in progress: its time, the actions decided so far, the
	// lease calls still to make (batches of at most maxItems buckets), the
	// buckets of the call out, and the returns to make first.
	now     time.Time
	acts    []*rlqsv3.RateLimitQuotaResponse_BucketAction
	batches [][]*quota
	sent    []*quota
	returns []*leasev1.ReturnRequest
	busy    bool
}

// Outbox is what a Core asks of its caller, in order: the Returns (tokens
// debited and no longer needed: a failure only costs utilisation), then
// the Lease call, whose answer goes to Leased. When Lease is nil the round
// is over and Response, if not nil, is sent to the proxy.
type Outbox struct {
	Returns  []*leasev1.ReturnRequest
	Lease    *leasev1.LeaseRequest
	Response *rlqsv3.RateLimitQuotaResponse
}

// NewCore returns the core of one proxy stream leasing as agentID, for
// cfg (its Leaser, Registerer, Logger and Clock are not used) with its
// defaults filled, sharing fair with the other streams of its region's
// server. now starts its ticks.
func NewCore(cfg Config, fair *Fair, agentID string, now time.Time) (*Core, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validateCore(); err != nil {
		return nil, err
	}
	m, err := newMetrics(nil)
	if err != nil {
		return nil, err
	}
	return newCore(cfg, m, fair, agentID, now), nil
}

func newCore(cfg Config, m *metrics, fair *Fair, agentID string, now time.Time) *Core {
	return &Core{
		cfg:    cfg,
		z:      sizing{ttl: cfg.TTL, slack: cfg.Slack, fill: cfg.FillInterval, headroom: cfg.Headroom, use: cfg.Use},
		lim:    limits{entries: cfg.MaxEntries, entryLen: cfg.MaxEntryLen, requests: cfg.MaxRequests},
		met:    m,
		fair:   fair,
		agent:  &leasev1.Agent{Id: agentID},
		quotas: map[string]*quota{},
		last:   now,
	}
}

// errBusy is the panic of a round begun before the last one ended: the
// caller broke the Core's contract.
var errBusy = errors.New("rlqs: a Core round began before the last one ended")

func (c *Core) begin(now time.Time) {
	if c.busy {
		panic(errBusy)
	}
	c.busy, c.now = true, now
}

// Report checks and counts one usage report received at now, and plans an
// answer at once for the buckets it subscribes. A bad report as a whole
// (no domain on the stream's first, another domain, too many usages)
// returns an InvalidArgument status error, and the stream should end; a
// bad usage is ignored and counted.
func (c *Core) Report(now time.Time, pol *policy.Set, m *rlqsv3.RateLimitQuotaUsageReports) (Outbox, error) {
	c.met.reports.Inc()
	switch d := m.GetDomain(); {
	case c.domain == "" && d == "":
		return Outbox{}, status.Error(codes.InvalidArgument, "rlqs: domain is required on a stream's first report")
	case c.domain == "":
		c.domain = d
	case d != "" && d != c.domain:
		return Outbox{}, status.Errorf(codes.InvalidArgument, "rlqs: domain %q, but the stream's is %q", d, c.domain)
	}
	us := m.GetBucketQuotaUsages()
	if len(us) > c.cfg.MaxBuckets {
		return Outbox{}, status.Errorf(codes.InvalidArgument, "rlqs: %d bucket usages, more than %d", len(us), c.cfg.MaxBuckets)
	}
	c.begin(now)
	var fresh []*quota
	for _, bu := range us {
		u, bad := decodeUsage(bu, c.lim)
		if bad != "" {
			c.met.invalid.WithLabelValues(bad).Inc()
			continue
		}
		q := c.quotas[u.id]
		if q == nil {
			if len(c.quotas) >= c.cfg.MaxBuckets {
				c.met.invalid.WithLabelValues(badTooMany).Inc()
				continue
			}
			q = &quota{id: u.id, bucket: u.bucket, sampled: now, reported: now, lastActive: now}
			c.resolve(q, pol)
			c.quotas[u.id] = q
			c.met.buckets.Inc()
			fresh = append(fresh, q)
		}
		q.observe(u, now)
	}
	c.plan(fresh)
	return c.next(), nil
}

// resolve maps q to its rule and key in pol.
func (c *Core) resolve(q *quota, pol *policy.Set) {
	q.pol = pol
	q.rule, q.key, q.bad = nil, "", ""
	r, key, err := Resolve(pol, c.cfg.DomainKey, c.domain, q.bucket)
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
			c.fair.set(q.storeKey, q.counted, 0)
			q.storeKey, q.counted = sk, 0
		}
	}
	if q.bad != "" {
		c.met.invalid.WithLabelValues(q.bad).Inc()
	}
}

// Tick, every KeepAlive, abandons idle buckets, follows policy changes
// (pol is the policy in force at now) and plans every bucket's keep-alive
// or new assignment.
func (c *Core) Tick(now time.Time, pol *policy.Set) Outbox {
	c.begin(now)
	elapsed := now.Sub(c.last)
	c.last = now
	var gone []*quota
	qs := make([]*quota, 0, len(c.quotas))
	for id, q := range c.quotas {
		if now.Sub(q.lastActive) > c.cfg.IdleAfter {
			c.add(q, action{kind: actAbandon})
			gone = append(gone, q)
			c.fair.set(q.storeKey, q.counted, 0)
			delete(c.quotas, id)
			c.met.buckets.Dec()
			continue
		}
		if q.pol != pol {
			old, oldKey := q.rule, q.key
			c.resolve(q, pol)
			if (q.rule == nil) != (old == nil) || q.rule != nil && q.rule.Name != old.Name || q.key != oldKey {
				// Another rule or key: what was debited for the old one goes
				// back to it; the proxy's refills paid stand until they end.
				if q.bank > 0 && old != nil {
					c.returns = append(c.returns, c.returnRequests([]retItem{{rule: old.Name, key: oldKey, tokens: q.bank}})...)
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
	c.returns = append(c.returns, c.banks(gone)...)
	c.plan(qs)
	return c.next()
}

// plan decides the round's actions of qs that need no store, and batches
// the asks of the others.
func (c *Core) plan(qs []*quota) {
	var asks []*quota
	for _, q := range qs {
		switch {
		case q.bad != "":
		case q.rule == nil:
			c.add(q, action{kind: actAllow, ttl: c.z.ttl})
		default:
			keyRate := c.fair.set(q.storeKey, q.counted, q.rate)
			q.counted = q.rate
			c.z.plan(q, c.now, c.cfg.KeepAlive, keyRate)
			if q.want == 0 && q.tallyDemand > 0 {
				q.want = q.rule.Cost // an item carries demand only with an ask
			}
			if q.want > 0 {
				asks = append(asks, q)
			} else {
				c.add(q, c.z.settle(q, c.now, 0))
				c.trim(q)
			}
		}
	}
	for len(asks) > 0 {
		n := min(len(asks), maxItems)
		c.batches = append(c.batches, asks[:n:n])
		asks = asks[n:]
	}
}

// next is the round's next Outbox: the returns due, then the next lease
// call, or, when none is left, the response.
func (c *Core) next() Outbox {
	out := Outbox{Returns: c.returns}
	c.returns = nil
	if len(c.batches) > 0 {
		qs := c.batches[0]
		c.batches = c.batches[1:]
		c.sent = qs
		items := make([]*leasev1.LeaseItem, len(qs))
		for i, q := range qs {
			cost := q.rule.Cost
			items[i] = &leasev1.LeaseItem{Rule: q.rule.Name, Key: q.key, Want: q.want,
				Demand: q.tallyDemand * cost, Admitted: q.tallyAllowed * cost}
		}
		out.Lease = &leasev1.LeaseRequest{Agent: c.agent, Items: items}
		return out
	}
	if len(c.acts) > 0 {
		out.Response = &rlqsv3.RateLimitQuotaResponse{BucketAction: c.acts}
	}
	c.acts, c.busy = nil, false
	return out
}

// Leased takes the answer to the Outbox's Lease call and returns the next
// Outbox. A call refused as a whole for one item (a rule's clients, an
// item the service finds invalid) is made again item by item, so one
// bucket cannot fail the others; another failure applies each rule's
// on_error.
func (c *Core) Leased(resp *leasev1.LeaseResponse, err error) Outbox {
	qs := c.sent
	c.sent = nil
	if err == nil && len(resp.GetGrants()) != len(qs) {
		err = status.Errorf(codes.Internal, "rlqs: %d grants for %d items", len(resp.GetGrants()), len(qs))
	}
	if err == nil {
		for i, q := range qs {
			// The demand went with this call; the next one tells the next.
			q.tallyDemand, q.tallyAllowed = 0, 0
			c.add(q, c.settle(q, resp.GetGrants()[i]))
		}
		return c.next()
	}
	code := status.Code(err)
	c.met.failures.WithLabelValues(code.String()).Inc()
	refused := code == codes.InvalidArgument || code == codes.PermissionDenied
	if refused && len(qs) > 1 {
		singles := make([][]*quota, len(qs), len(qs)+len(c.batches))
		for i, q := range qs {
			singles[i] = []*quota{q}
		}
		c.batches = append(singles, c.batches...)
		return c.next()
	}
	for _, q := range qs {
		a := c.z.failed(q)
		if refused {
			// Not a failure of the region: this proxy may not have the
			// bucket's tokens.
			c.z.drop(q)
			a = action{kind: actDeny, ttl: c.z.ttl}
		}
		c.add(q, a)
	}
	return c.next()
}

// settle applies one grant: the region's refill learned, the tokens taken.
func (c *Core) settle(q *quota, g *leasev1.LeaseGrant) action {
	if g.GetRate() > 0 {
		q.regionRate = g.GetRate() / float64(q.rule.Cost)
	}
	q.spare = g.GetRemaining()
	granted := max(0, min(g.GetGranted(), q.want))
	c.met.debited.Add(float64(granted))
	a := c.z.settle(q, c.now, granted)
	c.trim(q)
	return a
}

// trim returns to the store what q's bank holds beyond the next
// keep-alive's refills, unless it is saving for an upsize still to come:
// the change of a fresh bucket, savings for an upsize its target no longer
// needs, what a bucket denied could not use. Banked tokens were debited
// earlier than the assignment that spends them, so each one held widens
// the bound by one (docs/RLQS.md, "The bank"); returned, they wait in the
// region's bucket, capped at its capacity.
func (c *Core) trim(q *quota) {
	if q.rule == nil || q.upsize && q.active != q.target {
		return
	}
	keep := c.z.refill(q.active, c.cfg.KeepAlive, q.rule.Cost)
	if n := q.bank - keep; n > 0 {
		c.returns = append(c.returns, c.returnRequests([]retItem{{rule: q.rule.Name, key: q.key, tokens: n}})...)
		q.bank = keep
	}
}

// Expire is the response that expires every bucket now (TTL 0), so that
// the proxy falls back at once rather than when its TTLs end: sent when
// the server shuts down. Nil when there is nothing to expire.
func (c *Core) Expire() *rlqsv3.RateLimitQuotaResponse {
	var acts []*rlqsv3.RateLimitQuotaResponse_BucketAction
	for _, q := range c.quotas {
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
		acts = append(acts, c.encode(q, a))
		c.met.actions.WithLabelValues("expire").Inc()
	}
	if len(acts) == 0 {
		return nil
	}
	return &rlqsv3.RateLimitQuotaResponse{BucketAction: acts}
}

// Release ends the stream: its buckets leave the Fair, and it returns the
// calls that give back the tokens debited and not given to the proxy.
// Refills already paid are not given back: the proxy may still spend them
// until its TTL ends.
func (c *Core) Release() []*leasev1.ReturnRequest {
	qs := make([]*quota, 0, len(c.quotas))
	for _, q := range c.quotas {
		qs = append(qs, q)
		c.fair.set(q.storeKey, q.counted, 0)
	}
	c.met.buckets.Sub(float64(len(c.quotas)))
	c.quotas = map[string]*quota{}
	return c.banks(qs)
}

type retItem struct {
	rule, key string
	tokens    int64
}

// banks is the return calls for the tokens qs debited and hold unspent.
func (c *Core) banks(qs []*quota) []*leasev1.ReturnRequest {
	var items []retItem
	for _, q := range qs {
		if q.rule != nil && q.bank > 0 {
			items = append(items, retItem{rule: q.rule.Name, key: q.key, tokens: q.bank})
			q.bank = 0
		}
	}
	return c.returnRequests(items)
}

func (c *Core) returnRequests(items []retItem) []*leasev1.ReturnRequest {
	var out []*leasev1.ReturnRequest
	for len(items) > 0 {
		n := min(len(items), maxItems)
		req := &leasev1.ReturnRequest{Agent: c.agent}
		for _, it := range items[:n] {
			req.Items = append(req.Items, &leasev1.ReturnItem{Rule: it.rule, Key: it.key, Tokens: it.tokens})
		}
		out = append(out, req)
		items = items[n:]
	}
	return out
}

// add appends q's action a to the round's, unless there is nothing to
// send.
func (c *Core) add(q *quota, a action) {
	if a.kind != actNone {
		c.acts = append(c.acts, c.encode(q, a))
	}
}

// Banked is the store tokens this stream's buckets of storeKey (rule and
// key, as policy.StoreKey names them) hold debited and not yet in an
// assignment: what docs/RLQS.md's bank term counts.
func (c *Core) Banked(storeKey string) int64 {
	var n int64
	for _, q := range c.quotas {
		if q.rule != nil && q.storeKey == storeKey {
			n += q.bank
		}
	}
	return n
}
