package exchange

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/region"
)

// This file answers an operator (regiond's admin API): the exchange's
// status and a key's state, read on the loop goroutine that owns the Node
// (a request and its answer over a channel, bounded by the caller's ctx),
// and each peer's report age, which the loop publishes in atomics so that
// a scrape never waits for it.

// ErrStopped is returned by Status and Inspect once the loop has stopped.
var ErrStopped = errors.New("exchange: stopped")

// Status is the exchange as this replica sees it.
type Status struct {
	// Holder is true when this replica runs its region's exchange.
	Holder bool
	Period time.Duration
	// Epoch is the latest epoch's number, Epochs how many the loop ran.
	Epoch, Epochs uint64
	// Keys is the number of global keys the exchange holds state for (on
	// the holder), Resting how many rested at the latest epoch.
	Keys, Resting int
	// Peers are the other regions, in Config.Regions order.
	Peers []Peer
	// Disagreements are the rules held for a disagreement, sorted.
	Disagreements []string
}

// Peer is another region as this replica hears it.
type Peer struct {
	Region string
	// Heard is when its latest complete report arrived (zero: never).
	Heard time.Time
	// Stale is true when that is longer ago than region.Config.StaleAfter:
	// the exchange plans without it.
	Stale bool
	// Policy is the policy name its latest report carried.
	Policy string
}

// KeyState is one key as the exchange holds it: View is meaningful on the
// holder only (Holder false: another replica runs the exchange).
type KeyState struct {
	Holder bool
	Period time.Duration
	View   region.KeyView
}

// request is a question for the loop; answer runs there.
type request struct {
	answer func()
	done   chan struct{}
}

// onLoop runs f on the loop goroutine and waits for it, until ctx ends or
// the loop stops.
func (x *Exchanger) onLoop(ctx context.Context, f func()) error {
	q := request{answer: f, done: make(chan struct{})}
	select {
	case x.requests <- q:
	case <-x.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-q.done:
		return nil
	case <-x.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Status returns the exchange's status, read on its loop (which may be in
// the middle of an epoch's store calls: ctx bounds the wait).
func (x *Exchanger) Status(ctx context.Context) (Status, error) {
	var st Status
	err := x.onLoop(ctx, func() {
		now := x.cfg.Clock()
		st = Status{Holder: x.node.Holding(), Period: x.cfg.Period, Epoch: x.node.LastEpoch(), Epochs: x.epochs.Load()}
		if st.Holder {
			st.Resting, st.Keys = x.node.Resting()
		}
		for _, r := range x.cfg.Regions {
			if r == x.cfg.Region {
				continue
			}
			p := Peer{Region: r, Heard: x.heard[r], Policy: x.peerPolicy[r]}
			p.Stale = p.Heard.IsZero() || now.Sub(p.Heard) > x.node.Config().StaleAfter
			st.Peers = append(st.Peers, p)
		}
		for rule := range x.disagreeing {
			st.Disagreements = append(st.Disagreements, rule)
		}
		slices.Sort(st.Disagreements)
	})
	return st, err
}

// Inspect returns a global key's state (a store key), read on the loop.
func (x *Exchanger) Inspect(ctx context.Context, key string) (KeyState, error) {
	var ks KeyState
	err := x.onLoop(ctx, func() {
		ks = KeyState{Holder: x.node.Holding(), Period: x.cfg.Period}
		if ks.Holder {
			ks.View = x.node.Inspect(key)
		}
	})
	return ks, err
}

// PeersHeard returns, per other region, when its latest complete report
// arrived (zero: never), without waiting for the loop.
func (x *Exchanger) PeersHeard() map[string]time.Time {
	out := make(map[string]time.Time, len(x.heardAt))
	for r, at := range x.heardAt {
		var t time.Time
		if ns := at.Load(); ns != 0 {
			t = time.Unix(0, ns)
		}
		out[r] = t
	}
	return out
}

// noteHeard records a complete report of region r received at now (on the
// loop).
func (x *Exchanger) noteHeard(r string, now time.Time, policy string) {
	x.heard[r] = now
	if r == x.cfg.Region {
		x.siblingAt.Store(now.UnixNano())
		return
	}
	x.peerPolicy[r] = policy
	if at := x.heardAt[r]; at != nil {
		at.Store(now.UnixNano())
	}
}

// newHeardAt makes the report times the loop publishes, one per peer.
func newHeardAt(cfg Config) map[string]*atomic.Int64 {
	m := make(map[string]*atomic.Int64, len(cfg.Regions))
	for _, r := range cfg.Regions {
		if r != cfg.Region {
			m[r] = new(atomic.Int64)
		}
	}
	return m
}

// peerLag is ration_exchange_peer_lag_seconds, computed at each scrape so
// that it grows while a peer is silent: the age of each peer's latest
// report, or of the exchange's start for a peer never heard.
type peerLag struct {
	x    *Exchanger
	desc *prometheus.Desc
}

func newPeerLag(x *Exchanger) *peerLag {
	return &peerLag{x: x, desc: prometheus.NewDesc("ration_exchange_peer_lag_seconds",
		"Seconds since the latest complete report from each other region arrived (since the exchange started for a region never heard), computed at scrape time.",
		[]string{"region"}, nil)}
}

func (p *peerLag) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }

func (p *peerLag) Collect(ch chan<- prometheus.Metric) {
	now := p.x.cfg.Clock()
	for r, at := range p.x.PeersHeard() {
		if at.IsZero() {
			at = p.x.started
		}
		ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, max(now.Sub(at).Seconds(), 0), r)
	}
}
