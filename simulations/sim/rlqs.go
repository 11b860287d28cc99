package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ration-dev/ration/lease/rlqs"
	leasev1 "github.com/ration-dev/ration/lease/v1"
)

// Envoy proxies leasing over RLQS (docs/RLQS.md). Each region with proxies
// runs one RLQS server: a stream per connected proxy, each driven by
// lease/rlqs's Core (the code regiond's stream handler drives), its lease
// and return calls made on the region's real lease service, a Fair shared
// by the region's streams. The proxy side is Envoy's rate_limit_quota
// filter as docs/RLQS.md and the shared notes describe it: all buckets in
// one report every report interval (a new bucket's subscription at once),
// the domain on every report, time_elapsed truncated to whole seconds;
// a token bucket full at max_tokens and refilled continuously, kept
// across responses only while its three fields match; blanket rules; a TTL
// read in whole seconds from receipt; abandon forgets the bucket; with no
// assignment in force, the configured fallback.
//
// Timing: a report takes half an agent_rtt to regiond; a lease call half
// the Redis latency to the store and half back; a response half an
// agent_rtt to the proxy. Returns act on the store at once. A stream
// handles one round (a report or a keep-alive tick and its lease calls) at
// a time, as the handler's goroutine does; what arrives meanwhile waits.

// simDomain is the proxies' RLQS domain. The bucket id of key k is its
// descriptors (rule=<rule>, <group>=<value>), so that the domain, mapped
// to descriptor domain=sim, leaves the rule and its key as the agents'.
const simDomain = "sim"

type proxyEventKind uint8

const (
	pxPeriodic proxyEventKind = iota // a proxy's report timer
	pxReport                         // a report reaches regiond
	pxTick                           // a stream's keep-alive tick, in regiond
	pxStore                          // a lease call reaches the store
	pxLeased                         // its answer is back in regiond
	pxResponse                       // a response reaches the proxy
)

// proxyEvent is an evProxy event's detail.
type proxyEvent struct {
	kind   proxyEventKind
	p      *proxySim
	st     *proxyStream
	report *rlqsv3.RateLimitQuotaUsageReports
	lease  *leasev1.LeaseRequest
	resp   *leasev1.LeaseResponse
	err    error
	out    *rlqsv3.RateLimitQuotaResponse
}

// The paths of a proxy's decisions, counted in the summary's paths.
const (
	pathTokenBucket = iota
	pathAllowAll
	pathDenyAll
	pathFallback
	nPaths
)

var proxyPathNames = [nPaths]string{"rlqs_token_bucket", "rlqs_allow_all", "rlqs_deny_all", "rlqs_fallback"}

// proxyWorld is the run's proxies.
type proxyWorld struct {
	cfg     rlqs.Config       // the RLQS servers', defaults filled
	rnd     *rand.Rand        // the proxies' own: other scenarios draw nothing from it
	seq     uint64            // streams opened
	initial int               // proxies at the start: at most as many live at once
	keyOf   map[[2]string]int // key index by the bucket id's rule and value
	// The worst, over keys and checks, of the assignments in force: Σ
	// max_tokens against the bound's term for it, and Σ tokens_per_fill
	// against L per fill_interval (what L·(TTL + Slack) assumes).
	maxRatio, fillRatio, bankRatio float64
	dec                            [nPaths][2]int64
}

// regionProxies is one region's proxies and RLQS server.
type regionProxies struct {
	live []*proxySim
	fair rlqs.Fair
	cut  map[int][]*proxySim // by fault: the proxies whose streams it broke
	n    int                 // proxies named so far
}

// proxySim is one Envoy proxy.
type proxySim struct {
	r       *regiond
	name    string
	alive   bool
	buckets []*envoyBucket // by key index; nil: none
	stream  *proxyStream   // nil: disconnected
}

// proxyStream is regiond's side of one stream.
type proxyStream struct {
	p                     *proxySim
	core                  *rlqs.Core
	busy, tickDue, closed bool
	queue                 []*rlqsv3.RateLimitQuotaUsageReports
}

// envoyBucket is the filter's state of one bucket.
type envoyBucket struct {
	id map[string]string
	// The assignment: none before the first (assigned false), then a
	// blanket rule or a token bucket until expires.
	assigned         bool
	blanket          typev3.RateLimitStrategy_BlanketRule
	isBlanket        bool
	tb               *typev3.TokenBucket
	tokens           float64
	filled, expires  int64
	created          int64
	allowed, denied  uint64
	reported         int64 // -1: never
	fbOpen           bool  // in fallback, with a span in the meter
	fbTokens         float64
	fbFilled, fbSpan int64
}

// newProxies makes the scenario's proxies, in the regions that have some;
// those regions get no agents.
func (w *world) newProxies() error {
	sc := w.sc
	if sc.RLQS == nil || w.alg == Ideal {
		return nil
	}
	w.px = &proxyWorld{cfg: rlqs.Config{}.WithDefaults(), rnd: rand.New(rand.NewPCG(sc.Seed, 0x726c7173)),
		keyOf: make(map[[2]string]int, len(w.keys))}
	for ki, k := range w.keys {
		w.px.keyOf[[2]string{k.ds[0].Value, k.ds[1].Value}] = ki
	}
	for _, r := range w.rs {
		n := sc.RLQS.Proxies[r.name]
		if n == 0 {
			continue
		}
		r.px = &regionProxies{cut: map[int][]*proxySim{}}
		for range n {
			if err := w.addProxy(r, 0); err != nil {
				return err
			}
		}
		w.px.initial += n
	}
	return nil
}

// proxied reports whether region r is served by proxies.
func (r *regiond) proxied() bool { return r.px != nil }

// addProxy starts a cold proxy in region r at t: its stream connects, its
// report timer starts at a random phase.
func (w *world) addProxy(r *regiond, t int64) error {
	p := &proxySim{r: r, name: fmt.Sprintf("%s-p%d", r.name, r.px.n), alive: true, buckets: make([]*envoyBucket, len(w.keys))}
	r.px.n++
	r.px.live = append(r.px.live, p)
	every := int64(w.sc.RLQS.ReportInterval)
	w.pushProxy(t+w.px.rnd.Int64N(every), &proxyEvent{kind: pxPeriodic, p: p})
	return w.connect(p, t)
}

func (w *world) pushProxy(at int64, e *proxyEvent) {
	w.ev.push(event{at: at, kind: evProxy, px: e})
}

// connect opens a stream for p at t and re-reports its buckets at once, as
// a reconnecting proxy does.
func (w *world) connect(p *proxySim, t int64) error {
	w.px.seq++
	core, err := rlqs.NewCore(w.px.cfg, &p.r.px.fair, fmt.Sprintf("rlqs/%s/%d", p.name, w.px.seq), w.regionTime(p.r))
	if err != nil {
		return fmt.Errorf("sim: proxy %s: %w", p.name, err)
	}
	p.stream = &proxyStream{p: p, core: core}
	w.pushProxy(t+int64(w.px.cfg.KeepAlive), &proxyEvent{kind: pxTick, p: p, st: p.stream})
	w.sendReport(p, t)
	return nil
}

// disconnect breaks p's stream: regiond's side ends (at once, or when its
// round in flight does), and the proxy keeps what it holds.
func (w *world) disconnect(p *proxySim) {
	st := p.stream
	if st == nil {
		return
	}
	p.stream = nil
	st.closed = true
	if !st.busy {
		w.release(st)
	}
}

// release ends a stream on regiond's side: its tokens debited and not
// given go back.
func (w *world) release(st *proxyStream) {
	w.returns(st.p.r, st.core.Release())
}

func (w *world) returns(r *regiond, reqs []*leasev1.ReturnRequest) {
	for _, req := range reqs {
		_, _ = r.svc.Return(w.ctx, req) // a failure only costs utilisation
	}
}

func (w *world) halfRTT() int64 {
	nw := &w.sc.Network
	rtt := int64(nw.AgentRTT)
	if j := int64(nw.AgentJitter); j > 0 {
		rtt += w.px.rnd.Int64N(2*j+1) - j
	}
	return max(rtt, 0) / 2
}

// proxyEvent handles an evProxy event.
func (w *world) proxyEvent(e *proxyEvent) {
	t := w.now
	switch e.kind {
	case pxPeriodic:
		if !e.p.alive {
			return
		}
		w.sendReport(e.p, t)
		w.pushProxy(t+int64(w.sc.RLQS.ReportInterval), e)
	case pxReport:
		if !e.st.closed {
			e.st.queue = append(e.st.queue, e.report)
			w.serveStream(e.st)
		}
	case pxTick:
		if !e.st.closed {
			e.st.tickDue = true
			w.serveStream(e.st)
			w.pushProxy(t+int64(w.px.cfg.KeepAlive), e)
		}
	case pxStore:
		r := e.st.p.r
		resp, err := r.svc.Lease(w.ctx, e.lease)
		w.announceDry(r, t)
		w.pushProxy(t+int64(w.sc.Redis.Latency)/2, &proxyEvent{kind: pxLeased, p: e.p, st: e.st, resp: resp, err: err})
	case pxLeased:
		w.carry(e.st, e.st.core.Leased(e.resp, e.err))
		w.serveStream(e.st)
	case pxResponse:
		if e.p.alive && e.p.stream == e.st {
			w.apply(e.p, e.out, t)
		}
	}
}

// serveStream starts the stream's next round, if it has none in flight:
// the reports that arrived first, then a tick due (a Go ticker keeps one).
func (w *world) serveStream(st *proxyStream) {
	r := st.p.r
	for !st.busy && !st.closed {
		now, pol := w.regionTime(r), r.svc.Policy()
		switch {
		case len(st.queue) > 0:
			m := st.queue[0]
			st.queue = st.queue[1:]
			out, err := st.core.Report(now, pol, m)
			if err != nil {
				w.fail(fmt.Errorf("sim: proxy %s: %w", st.p.name, err))
				return
			}
			w.carry(st, out)
		case st.tickDue:
			st.tickDue = false
			w.carry(st, st.core.Tick(now, pol))
		default:
			return
		}
	}
}

// carry does what a Core's Outbox says: the returns at once, the lease
// call sent to the store, or, at the round's end, the response sent to the
// proxy (unless the stream broke meanwhile, which ends it now).
func (w *world) carry(st *proxyStream, out rlqs.Outbox) {
	r := st.p.r
	w.returns(r, out.Returns)
	if out.Lease != nil {
		st.busy = true
		w.pushProxy(w.now+int64(w.sc.Redis.Latency)/2, &proxyEvent{kind: pxStore, p: st.p, st: st, lease: out.Lease})
		return
	}
	st.busy = false
	if st.closed {
		w.release(st)
		return
	}
	if out.Response != nil {
		w.pushProxy(w.now+w.halfRTT(), &proxyEvent{kind: pxResponse, p: st.p, st: st, out: out.Response})
	}
}

// sendReport sends every bucket's usage in one message, if p is connected
// and has buckets; a disconnected proxy keeps counting.
func (w *world) sendReport(p *proxySim, t int64) {
	st := p.stream
	if st == nil {
		return
	}
	var m *rlqsv3.RateLimitQuotaUsageReports
	for _, b := range p.buckets {
		if b == nil {
			continue
		}
		if m == nil {
			m = &rlqsv3.RateLimitQuotaUsageReports{Domain: simDomain}
		}
		var el time.Duration
		if b.reported >= 0 {
			el = dur(t - b.reported).Truncate(time.Second) // whole seconds, maybe 0
		}
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: b.id},
			TimeElapsed:        durationpb.New(el),
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.reported = 0, 0, t
	}
	if m != nil {
		w.pushProxy(t+w.halfRTT(), &proxyEvent{kind: pxReport, p: p, st: st, report: m})
	}
}

// apply carries out a response's bucket actions in order, at t.
func (w *world) apply(p *proxySim, out *rlqsv3.RateLimitQuotaResponse, t int64) {
	for _, a := range out.GetBucketAction() {
		ki := w.proxyKey(a.GetBucketId().GetBucket())
		if ki < 0 || p.buckets[ki] == nil {
			continue
		}
		b := p.buckets[ki]
		if a.GetAbandonAction() != nil {
			w.closeFallback(b, ki, t)
			p.buckets[ki] = nil
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		if qa == nil {
			continue
		}
		w.closeFallback(b, ki, t)
		b.assigned = true
		b.expires = t + qa.GetAssignmentTimeToLive().GetSeconds()*int64(time.Second) // nanos ignored
		rs := qa.GetRateLimitStrategy()
		if tb := rs.GetTokenBucket(); tb != nil {
			if b.isBlanket || !sameBucket(tb, b.tb) {
				b.tb, b.tokens, b.filled = tb, float64(tb.GetMaxTokens()), t // a fresh, full bucket
			}
			b.isBlanket = false
			continue
		}
		b.isBlanket, b.blanket, b.tb = true, rs.GetBlanketRule(), nil
	}
}

func sameBucket(a, b *typev3.TokenBucket) bool {
	return b != nil && a.GetMaxTokens() == b.GetMaxTokens() &&
		a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().AsDuration() == b.GetFillInterval().AsDuration()
}

// proxyKey is the key index of a bucket id: its rule descriptor's rule,
// and the value of its group's descriptor.
func (w *world) proxyKey(id map[string]string) int {
	rule := id[w.keys[0].ds[0].Key]
	for name, value := range id {
		if ki, ok := w.px.keyOf[[2]string{rule, value}]; ok && w.keys[ki].ds[1].Key == name && len(id) == 2 {
			return ki
		}
	}
	return -1
}

// proxyRequest decides a request of key ki in region r at now on one of
// its live proxies, picked uniformly.
func (w *world) proxyRequest(r *regiond, ri, ki int, now time.Duration) {
	live := r.px.live
	if len(live) == 0 {
		return
	}
	p := live[w.arr.IntN(len(live))]
	t := int64(now)
	b := p.buckets[ki]
	if b == nil {
		ds := w.keys[ki].ds
		b = &envoyBucket{id: map[string]string{ds[0].Key: ds[0].Value, ds[1].Key: ds[1].Value}, created: t, reported: -1}
		p.buckets[ki] = b
		defer w.sendReport(p, t) // the subscription, with this request counted
	}
	path, ok := pathFallback, false
	switch {
	case !b.assigned || t >= b.expires:
		from := b.created
		if b.assigned {
			from = b.expires
		}
		ok = w.fallbackDecide(b, ki, from, t)
	case b.isBlanket:
		path, ok = pathDenyAll, b.blanket == typev3.RateLimitStrategy_ALLOW_ALL
		if ok {
			path = pathAllowAll
		}
	default:
		path = pathTokenBucket
		tb := b.tb
		fill := tb.GetFillInterval().AsDuration().Seconds()
		b.tokens = min(float64(tb.GetMaxTokens()), b.tokens+float64(tb.GetTokensPerFill().GetValue())*dur(t-b.filled).Seconds()/fill)
		b.filled = t
		if b.tokens >= 1 {
			b.tokens--
			ok = true
		}
	}
	if ok {
		b.allowed++
		w.px.dec[path][1]++
		w.m.admitted(ki, ri, w.keys[ki].cost, t)
	} else {
		b.denied++
		w.px.dec[path][0]++
	}
}

// fallbackDecide is the configured fallback's decision for a bucket with
// no assignment in force since from. What it admits is outside the
// server's pre-debit, so each stretch of fallback that admits adds to the
// key's bound in the windows it meets (docs/RLQS.md, "What a proxy's
// configured fallback adds"): a token bucket its capacity and its refill
// over the stretch; allow_all leaves those windows unbounded.
func (w *world) fallbackDecide(b *envoyBucket, ki int, from, t int64) bool {
	fb := &w.sc.RLQS.Fallback
	if fb.Kind == FallbackDenyAll {
		return false
	}
	if !b.fbOpen {
		b.fbOpen, b.fbTokens, b.fbFilled = true, float64(fb.MaxTokens), from
		span := faultSpan{from: from, to: math.MaxInt64, tokens: math.Inf(1)}
		if fb.Kind == FallbackTokenBucket {
			span.tokens = float64(fb.MaxTokens * w.keys[ki].cost)
			span.rate = float64(fb.TokensPerFill*w.keys[ki].cost) / fb.FillInterval.Seconds()
		}
		km := &w.m.keys[ki]
		km.faults = append(km.faults, span)
		b.fbSpan = int64(len(km.faults) - 1)
	}
	if fb.Kind == FallbackAllowAll {
		return true
	}
	b.fbTokens = min(float64(fb.MaxTokens), b.fbTokens+float64(fb.TokensPerFill)*dur(t-b.fbFilled).Seconds()/fb.FillInterval.Seconds())
	b.fbFilled = t
	if b.fbTokens >= 1 {
		b.fbTokens--
		return true
	}
	return false
}

// closeFallback ends, at t, the bucket's stretch of fallback, if one is
// open.
func (w *world) closeFallback(b *envoyBucket, ki int, t int64) {
	if b.fbOpen {
		w.m.keys[ki].faults[b.fbSpan].to = t
		b.fbOpen = false
	}
}
