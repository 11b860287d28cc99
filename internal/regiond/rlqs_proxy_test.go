package regiond

import (
	"context"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// envoyProxy behaves as Envoy's rate_limit_quota filter does, from the
// protocol's point of view: one bucket per tenant, subscribed by a report
// at its first request; all buckets reported in one message every
// interval, the domain on every message, time_elapsed truncated to whole
// seconds; an assignment's TTL read in whole seconds; a token bucket that
// starts full at max_tokens and refills continuously at tokens_per_fill per
// fill_interval, kept across responses only while all three match; a
// blanket rule; no_assignment and expired_assignment behaviour DENY_ALL,
// so that what it admits is what the server assigned. Requests arrive at a
// set rate; what it admits is recorded in 100 ms slots of a ledger shared
// by every proxy of a test.
type envoyProxy struct {
	t      *testing.T
	addr   string
	domain string
	every  time.Duration // report interval
	ledger *ledger       // every proxy's
	own    *ledger       // this proxy's

	mu      sync.Mutex
	rate    float64 // requests per second
	buckets map[string]*proxyBucket
	tenant  string
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	conn    *grpc.ClientConn
	stream  rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	sendMu  sync.Mutex
}

type proxyBucket struct {
	id              map[string]string
	blanket         typev3.RateLimitStrategy_BlanketRule
	hasBlanket      bool
	tb              *typev3.TokenBucket
	tokens          float64
	filled          time.Time
	expires         time.Time // zero: no assignment yet
	allowed, denied uint64
	reported        time.Time
	resend          bool // report at once (a new stream)
}

// ledger counts admissions of all proxies in 100 ms slots from start.
type ledger struct {
	mu    sync.Mutex
	start time.Time
	slots []int64
}

const slot = 100 * time.Millisecond

func (l *ledger) add(now time.Time, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := int(now.Sub(l.start) / slot)
	for len(l.slots) <= i {
		l.slots = append(l.slots, 0)
	}
	l.slots[i] += n
}

// recent is the admissions per second over the complete slots of the last
// d before now.
func (l *ledger) recent(now time.Time, d time.Duration) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	end := min(int(now.Sub(l.start)/slot), len(l.slots))
	k := int(d / slot)
	var sum int64
	for i := max(0, end-k); i < end; i++ {
		sum += l.slots[i]
	}
	return float64(sum) / d.Seconds()
}

// maxWindow is the most admitted in any window of w (a multiple of slot).
func (l *ledger) maxWindow(w time.Duration) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := int(w / slot)
	var sum, best int64
	for i, v := range l.slots {
		sum += v
		if i >= k {
			sum -= l.slots[i-k]
		}
		best = max(best, sum)
	}
	return best
}

func startEnvoyProxy(t *testing.T, addr, domain, tenant string, rate float64, every time.Duration, l *ledger) *envoyProxy {
	t.Helper()
	p := &envoyProxy{t: t, addr: addr, domain: domain, tenant: tenant, rate: rate, every: every, ledger: l, own: &ledger{start: l.start},
		buckets: map[string]*proxyBucket{}}
	p.connect()
	t.Cleanup(p.stop)
	return p
}

// connect opens a stream and starts the request loop and the reader.
func (p *envoyProxy) connect() {
	p.t.Helper()
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		conn.Close()
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.conn, p.stream, p.cancel = conn, stream, cancel
	// A new stream re-reports every bucket at once, as a reconnecting
	// proxy does, with the time since its last report.
	for _, b := range p.buckets {
		b.resend = true
	}
	p.mu.Unlock()
	p.wg.Add(2)
	go p.requests(ctx)
	go p.read(stream)
}

// disconnect breaks the stream: the proxy keeps enforcing what it holds
// until its TTLs end, then denies, and keeps counting its requests.
func (p *envoyProxy) disconnect() {
	p.mu.Lock()
	cancel, conn := p.cancel, p.conn
	p.mu.Unlock()
	cancel()
	p.wg.Wait()
	conn.Close()
	// Keep the requests flowing without a stream.
	ctx, cancel2 := context.WithCancel(context.Background())
	p.mu.Lock()
	p.stream, p.cancel = nil, cancel2
	p.mu.Unlock()
	p.wg.Add(1)
	go p.requests(ctx)
}

// reconnect ends the stream-less request loop and connects again.
func (p *envoyProxy) reconnect() {
	p.mu.Lock()
	cancel := p.cancel
	p.mu.Unlock()
	cancel()
	p.wg.Wait()
	p.connect()
}

func (p *envoyProxy) stop() {
	p.mu.Lock()
	cancel, conn := p.cancel, p.conn
	p.mu.Unlock()
	cancel()
	p.wg.Wait()
	conn.Close()
}

func (p *envoyProxy) setRate(r float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rate = r
}

// requests admits or denies requests at the set rate every 10 ms and
// reports every interval (and at once for a new bucket).
func (p *envoyProxy) requests(ctx context.Context) {
	defer p.wg.Done()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	var owed float64
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			p.mu.Lock()
			owed += p.rate * now.Sub(last).Seconds()
			last = now
			n := int64(owed)
			owed -= float64(n)
			id := map[string]string{"tenant": p.tenant}
			b := p.buckets[p.tenant]
			if b == nil && n > 0 {
				b = &proxyBucket{id: id}
				p.buckets[p.tenant] = b
			}
			var admitted int64
			for range n {
				if p.decide(b, now) {
					admitted++
					b.allowed++
				} else {
					b.denied++
				}
			}
			var msg *rlqsv3.RateLimitQuotaUsageReports
			if p.stream != nil && b != nil && (b.reported.IsZero() || b.resend || now.Sub(b.reported) >= p.every) {
				msg = p.report(now)
			}
			stream := p.stream
			p.mu.Unlock()
			p.ledger.add(now, admitted)
			p.own.add(now, admitted)
			if msg != nil {
				p.sendMu.Lock()
				_ = stream.Send(msg)
				p.sendMu.Unlock()
			}
		}
	}
}

// decide is the filter's decision for one request, under p.mu.
func (p *envoyProxy) decide(b *proxyBucket, now time.Time) bool {
	if b.expires.IsZero() || !now.Before(b.expires) {
		return false // no assignment, or expired: DENY_ALL
	}
	if b.hasBlanket {
		return b.blanket == typev3.RateLimitStrategy_ALLOW_ALL
	}
	tb := b.tb
	fill := tb.GetFillInterval().AsDuration()
	b.tokens = min(float64(tb.GetMaxTokens()), b.tokens+float64(tb.GetTokensPerFill().GetValue())*now.Sub(b.filled).Seconds()/fill.Seconds())
	b.filled = now
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// report is every bucket's usage in one message, under p.mu.
func (p *envoyProxy) report(now time.Time) *rlqsv3.RateLimitQuotaUsageReports {
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: p.domain}
	for _, b := range p.buckets {
		el := time.Duration(0)
		if !b.reported.IsZero() {
			el = now.Sub(b.reported).Truncate(time.Second) // whole seconds, maybe 0
		}
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: b.id},
			TimeElapsed:        durationpb.New(el),
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.reported, b.resend = 0, 0, now, false
	}
	return m
}

// read applies the server's bucket actions in order.
func (p *envoyProxy) read(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient) {
	defer p.wg.Done()
	for {
		resp, err := stream.Recv()
		if err != nil {
			return
		}
		now := time.Now()
		p.mu.Lock()
		for _, a := range resp.GetBucketAction() {
			key := a.GetBucketId().GetBucket()["tenant"]
			if a.GetAbandonAction() != nil {
				delete(p.buckets, key)
				continue
			}
			b := p.buckets[key]
			qa := a.GetQuotaAssignmentAction()
			if b == nil || qa == nil {
				continue
			}
			ttl := time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second // nanos ignored
			b.expires = now.Add(ttl)
			if ttl == 0 {
				b.expires = now // expire at once
			}
			rs := qa.GetRateLimitStrategy()
			if tb := rs.GetTokenBucket(); tb != nil {
				b.hasBlanket = false
				if !proto.Equal(tb, b.tb) {
					b.tb, b.tokens, b.filled = tb, float64(tb.GetMaxTokens()), now // a fresh, full bucket
				}
				continue
			}
			b.tb, b.hasBlanket, b.blanket = nil, true, rs.GetBlanketRule()
		}
		p.mu.Unlock()
	}
}
