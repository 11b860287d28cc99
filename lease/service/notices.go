package service

import (
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// Dry keys announced: each time the store's answer shows a key's bucket
// cannot grant for a while, the service tells every agent watching
// (WatchDry), so that an agent holding the key denies it locally until then
// rather than asking. A notice only ever denies; a subscriber that falls
// behind loses notices (each costs an ask at most).

// DryKey is a key whose regional bucket cannot grant a request's cost
// until Until (the service's clock).
type DryKey struct {
	Rule  *policy.Rule
	Key   string // the key within its rule, as agents name it
	Until time.Time
}

// dryHub fans DryKeys out to subscribers.
type dryHub struct {
	mu   sync.Mutex
	subs map[chan DryKey]struct{}
}

// dryBuffer is each subscriber's backlog before notices are dropped.
const dryBuffer = 4096

// SubscribeDry returns a channel of the keys the store reports dry from
// now on, and a function that ends the subscription. The simulator reads
// it; WatchDry streams it to agents.
func (s *Service) SubscribeDry() (<-chan DryKey, func()) {
	ch := make(chan DryKey, dryBuffer)
	h := &s.dryHub
	h.mu.Lock()
	if h.subs == nil {
		h.subs = make(map[chan DryKey]struct{})
	}
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs, ch)
		h.mu.Unlock()
	}
}

// DryWatchers returns how many subscribers (WatchDry streams among them)
// hear of dry keys.
func (s *Service) DryWatchers() int {
	h := &s.dryHub
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// announce tells the subscribers that storeKey of rule r is dry until
// (Clock nanoseconds).
func (s *Service) announce(r *policy.Rule, storeKey string, until int64) {
	h := &s.dryHub
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) == 0 {
		return
	}
	d := DryKey{Rule: r, Key: strings.TrimPrefix(storeKey, r.Name+"/"), Until: time.Unix(0, until)}
	for ch := range h.subs {
		select {
		case ch <- d:
		default:
			s.metrics.dryDropped.Inc()
		}
	}
}

// dryBatch is how long a WatchDry stream gathers notices into one message.
const dryBatch = 5 * time.Millisecond

// WatchDry implements leasev1.LeaseServiceServer: the keys the store
// reports dry, in messages of what a few milliseconds gathered, until the
// client goes away or Close.
func (s *Service) WatchDry(req *leasev1.WatchDryRequest, stream leasev1.LeaseService_WatchDryServer) error {
	if req.GetAgent().GetId() == "" {
		return invalid("agent.id is required")
	}
	ch, cancel := s.SubscribeDry()
	defer cancel()
	ctx := stream.Context()
	for {
		var first DryKey
		select {
		case first = <-ch:
		case <-ctx.Done():
			return nil
		case <-s.closed:
			return nil
		}
		batch := []DryKey{first}
		timer := time.NewTimer(dryBatch)
	gather:
		for len(batch) < s.cfg.MaxItems {
			select {
			case d := <-ch:
				batch = append(batch, d)
			case <-timer.C:
				break gather
			case <-ctx.Done():
				timer.Stop()
				return nil
			}
		}
		timer.Stop()
		n := s.dryNotice(batch)
		if len(n.Keys) == 0 {
			continue // every key of the batch can grant again by now
		}
		if err := stream.Send(n); err != nil {
			return err
		}
	}
}

// dryNotice is the message of batch, each key's wait as DryRetry gives it.
func (s *Service) dryNotice(batch []DryKey) *leasev1.DryNotice {
	n := &leasev1.DryNotice{Keys: make([]*leasev1.DryKey, 0, len(batch))}
	for _, d := range batch {
		if wait := s.DryRetry(d); wait > 0 {
			n.Keys = append(n.Keys, &leasev1.DryKey{Rule: d.Rule.Name, Key: d.Key, RetryAfter: durationpb.New(wait)})
		}
	}
	return n
}

// DryRetry is how long from now an agent told of d should deny its key:
// until d.Until, capped, for a global key, at ShareRetryAfter like a
// denial's hint (the exchange may raise its share at each epoch). Zero or
// less: no longer.
func (s *Service) DryRetry(d DryKey) time.Duration {
	wait := d.Until.Sub(s.cfg.Clock())
	if d.Rule.Scope != policy.ScopeRegion && s.cfg.ShareRetryAfter > 0 {
		wait = min(wait, s.cfg.ShareRetryAfter)
	}
	return wait
}
