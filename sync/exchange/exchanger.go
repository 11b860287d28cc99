package exchange

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
	"github.com/ration-dev/ration/sync/codec"
)

// Exchanger runs one replica's side of the cross-region exchange: the
// protocol of region.Node over NATS and the region's store. Each sync period
// it takes or renews its region's hold; the holder runs the epoch (the Node
// lowers shares in the store, commits, persists the state, publishes,
// raises), the other replicas publish their tallies only. Reports received
// from NATS are decoded, reassembled and handed to the Node.
//
// One goroutine, started by Start and waited for by Shutdown or Close, owns
// the Node; Observe and InitialShare may be called from any goroutine.
type Exchanger struct {
	cfg     Config
	initial int64
	subject string
	met     *metrics

	// Owned by the loop goroutine.
	node       *region.Node
	asm        *codec.Assembler
	peers      []string      // the other regions, whose readers decide the wire version
	wire       codec.Version // the wire version last written
	pol        *policy.Set
	holdUntil  time.Time     // our hold is safe to write under until then
	busy       time.Duration // time spent in the phases of the current epoch
	awakeEpoch uint64        // region.Awake.Epoch last counted in the metrics
	// epochAt is when the current epoch's tally phase began; writeBy is
	// when the current phase's share writes stop starting batches
	// (effects.WriteShares): the holder's Lower writes have until half the
	// period, leaving the rest for the save, or a quarter of a period when
	// the epoch started late; the raises have until the next epoch.
	epochAt, writeBy time.Time
	// lapsed: a renewal within an epoch (keepHold) found the hold had
	// lapsed; the Node learns it at the next Hold.
	lapsed  bool
	spent   spent // where the current epoch's time went (spent.go)
	written map[string]int64
	saved   savedRecords
	top     topKeys
	heard   map[string]time.Time // per region: last complete report
	// Per peer region: the policy name of its latest report (status.go).
	peerPolicy map[string]string
	// Rules held for a disagreement (agree.go).
	disagreeGen uint64
	disagreeing map[string]bool

	leader atomic.Bool
	epochs atomic.Uint64
	// siblingAt is when a report of another replica of our region last
	// arrived (Unix ns; siblings.go).
	siblingAt atomic.Int64

	tallies [16]tallyShard
	seed    maphash.Seed

	inbox chan []byte
	// requests carry an operator's questions to the loop (status.go);
	// heardAt is when each peer was last heard, published by the loop.
	requests chan request
	heardAt  map[string]*atomic.Int64
	started  time.Time
	sub      *nats.Subscription
	cancel   context.CancelFunc
	done     chan struct{}
	release  bool // Shutdown releases the hold
	once     sync.Once
}

type tallyShard struct {
	mu sync.Mutex
	m  map[string]*[2]int64
	_  [40]byte // keeps neighbouring locks off one cache line
}

// New returns an Exchanger for cfg; it touches neither NATS nor the store
// until Start. The error wraps ErrInvalidConfig or region.ErrInvalidConfig.
func New(cfg Config) (*Exchanger, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	x := &Exchanger{
		cfg:        cfg,
		subject:    cfg.Subject + "." + cfg.Region,
		asm:        codec.NewAssembler(codec.AssemblerConfig{Timeout: 2 * cfg.Period}),
		written:    make(map[string]int64),
		heard:      make(map[string]time.Time),
		peerPolicy: make(map[string]string),
		requests:   make(chan request),
		heardAt:    newHeardAt(cfg),
		started:    cfg.Clock(),
		seed:       maphash.MakeSeed(),
		inbox:      make(chan []byte, cfg.QueueSize),
		done:       make(chan struct{}),
		wire:       codec.V1,
	}
	x.saved.seed = x.seed
	for _, r := range cfg.Regions {
		if r != cfg.Region {
			x.peers = append(x.peers, r)
		}
	}
	rcfg := region.Config{
		Self:      cfg.Region,
		Replica:   cfg.Replica,
		Regions:   cfg.Regions,
		Period:    cfg.Period,
		Refresh:   cfg.Refresh,
		IdleAfter: cfg.IdleAfter,
		Policy:    func(key string) region.KeyPolicy { return x.pol.RuleOf(key).KeyPolicy() },
		Rules:     x.rules,
	}
	if cfg.Tune != nil {
		cfg.Tune(&rcfg)
	}
	n, err := region.NewNode(rcfg, effects{x})
	if err != nil {
		return nil, err
	}
	x.node = n
	x.initial = n.Initial(cfg.Region)
	for i := range x.tallies {
		x.tallies[i].m = make(map[string]*[2]int64)
	}
	if x.met, err = newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(newPeerLag(x)); err != nil {
			return nil, err
		}
	}
	return x, nil
}

// InitialShare is the share in ppm this region holds of a global key that
// the exchange has not moved: lease/service's Config.InitialShareFor.
func (x *Exchanger) InitialShare(key string, rule *policy.Rule) int64 { return x.initial }

// Observe records a global key's demand and grants for the current epoch:
// lease/service's Config.Observer. key is the store key (policy.StoreKey of
// the rule and the descriptor key). Cheap and safe for concurrent use.
func (x *Exchanger) Observe(key string, rule *policy.Rule, demand, granted int64) {
	if demand <= 0 && granted <= 0 {
		return
	}
	s := &x.tallies[maphash.String(x.seed, key)%uint64(len(x.tallies))]
	s.mu.Lock()
	t := s.m[key]
	if t == nil {
		t = new([2]int64)
		s.m[key] = t
	}
	t[0] += max(demand, 0)
	t[1] += max(granted, 0)
	s.mu.Unlock()
}

// Leader reports whether this replica ran its region's exchange at the
// latest epoch.
func (x *Exchanger) Leader() bool { return x.leader.Load() }

// Epochs returns how many epochs the loop has run.
func (x *Exchanger) Epochs() uint64 { return x.epochs.Load() }

// Start subscribes to every region's reports and starts the loop. It
// returns once subscribed; the loop runs until Shutdown or Close.
func (x *Exchanger) Start() error {
	sub, err := x.cfg.Conn.Subscribe(x.cfg.Subject+".*", func(m *nats.Msg) {
		select {
		case x.inbox <- m.Data:
		default:
			x.met.dropped.WithLabelValues(string(codec.ReasonOverflow)).Inc()
		}
	})
	if err != nil {
		return fmt.Errorf("exchange: subscribing to %s.*: %w", x.cfg.Subject, err)
	}
	// Reports of 100,000 keys are megabytes: let NATS buffer a few epochs
	// of them; the inbox bounds what waits beyond that.
	if err := sub.SetPendingLimits(64*1024, 512<<20); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("exchange: %w", err)
	}
	x.sub = sub
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	go x.run(ctx)
	return nil
}

// Shutdown stops the loop, waits for it, unsubscribes and gives the hold up
// if this replica holds it, so that another replica takes over at once.
// ctx bounds the release.
func (x *Exchanger) Shutdown(ctx context.Context) error {
	x.release = true
	return x.stop(ctx)
}

// Close stops at once, as a crash would: the loop ends and the
// subscription goes, but the hold stays until it lapses (HoldTTL), so
// another replica takes over only then.
func (x *Exchanger) Close() error {
	return x.stop(context.Background())
}

func (x *Exchanger) stop(ctx context.Context) error {
	var err error
	x.once.Do(func() {
		if x.cancel == nil {
			return // never started
		}
		if x.sub != nil {
			if uerr := x.sub.Unsubscribe(); uerr != nil && !errors.Is(uerr, nats.ErrConnectionClosed) && !errors.Is(uerr, nats.ErrBadSubscription) {
				err = fmt.Errorf("exchange: unsubscribe: %w", uerr)
			}
		}
		x.cancel()
		<-x.done
		if x.release && x.leader.Load() {
			if rerr := x.cfg.Coordinator.Release(ctx, x.cfg.Region, x.cfg.Replica); rerr != nil {
				err = errors.Join(err, fmt.Errorf("exchange: releasing the hold: %w", rerr))
			}
			x.leader.Store(false)
			x.met.leader.Set(0)
		}
	})
	return err
}

// run is the loop: each epoch starts at a multiple of Period on the wall
// clock with the tallies, and the holder decides DecideAfter later;
// received messages are handled in between.
func (x *Exchanger) run(ctx context.Context) {
	defer close(x.done)
	t := time.NewTimer(x.untilEpoch())
	defer t.Stop()
	deciding := false // the timer ends a holder's epoch
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-x.inbox:
			start := time.Now()
			x.renewIfHalf(ctx)
			x.receive(ctx, m)
			since(&x.spent.receive, start)
		case q := <-x.requests:
			q.answer()
			close(q.done)
		case <-t.C:
			switch {
			case deciding:
				x.decidePhase(ctx)
				deciding = false
				wait := x.untilEpoch()
				x.renewIfLate(ctx, wait)
				t.Reset(wait)
			case x.tallyPhase(ctx):
				deciding = true
				t.Reset(x.cfg.DecideAfter)
			default:
				t.Reset(x.untilEpoch())
			}
		}
	}
}

// renewIfLate renews the hold now when the next epoch, wait away, would
// renew it too late: an epoch that ran long (a slow store, a starved CPU)
// must not let the hold lapse, since a lapse drops the state and the
// take-over writes every share again, which makes the next epoch longer
// still (issue 12).
func (x *Exchanger) renewIfLate(ctx context.Context, wait time.Duration) {
	if x.node.Holding() && !time.Now().Add(wait).Before(x.holdUntil.Add(-x.cfg.Period/2)) {
		x.rehold(ctx)
	}
}

// renewIfHalf renews the hold between the loop's messages when half of it
// is gone: merging the reports of 100,000 keys on a starved machine took
// seconds.
func (x *Exchanger) renewIfHalf(ctx context.Context) {
	if x.node.Holding() && time.Until(x.holdUntil) < x.cfg.HoldTTL/2 {
		x.rehold(ctx)
	}
}

// rehold renews the hold outside the epoch's phases, and tells the Node.
func (x *Exchanger) rehold(ctx context.Context) {
	x.noteHold(x.node.Hold(ctx, x.renew(ctx)))
	holding := x.node.Holding()
	x.leader.Store(holding)
	if !holding {
		x.met.leader.Set(0)
	}
}

// renew takes or renews the hold for Node.Hold, reporting a lapse that
// keepHold found as one.
func (x *Exchanger) renew(ctx context.Context) region.Hold {
	defer since(&x.spent.hold, time.Now())
	h := x.acquire(ctx)
	if x.lapsed && h == region.HoldRenewed {
		h = region.HoldTaken
	}
	x.lapsed = false
	return h
}

var errHoldLapsed = errors.New("exchange: the hold lapsed during the epoch")

// keepHold renews the holder's hold in the middle of its epoch, from
// within the Node's Decide, when less than half of it is left: a long
// epoch must not let it lapse. A lapse found, or another holder, ends the
// hold's writes at once; the Node learns of it at the next Hold, or from
// the error.
func (x *Exchanger) keepHold(ctx context.Context) error {
	if x.lapsed {
		return errHoldLapsed
	}
	if time.Until(x.holdUntil) > x.cfg.HoldTTL/2 {
		return nil
	}
	switch x.acquire(ctx) { // its time counts in the effect's
	case region.HoldRenewed:
		return nil
	case region.HoldTaken:
		// Another replica may have run the exchange since it lapsed: the
		// take-over at the next Hold reads its state first.
		x.lapsed = true
		x.holdUntil = time.Time{}
		return errHoldLapsed
	case region.HoldNone:
		x.holdUntil = time.Time{}
		return fmt.Errorf("%w: another replica holds region %q", region.ErrNotHolder, x.cfg.Region)
	}
	return nil // unknown: writes go on while the hold is safe (holdCtx)
}

// untilEpoch is the time to the start of the next epoch: the next multiple
// of Period on the wall clock. A slow decision phase may leave little time
// before it, and that is fine (skipping the epoch would cost a period of
// convergence); only a boundary a few percent of a period away, which a
// clock step could make us fire twice for, moves to the one after.
func (x *Exchanger) untilEpoch() time.Duration {
	now := time.Now()
	next := now.Truncate(x.cfg.Period).Add(x.cfg.Period)
	if next.Sub(now) < x.cfg.Period/50 {
		next = next.Add(x.cfg.Period)
	}
	return next.Sub(now)
}

// receive decodes, reassembles and hands one message to the Node.
func (x *Exchanger) receive(ctx context.Context, msg []byte) {
	now := x.cfg.Clock()
	x.met.received.Inc()
	p, err := codec.DecodePart(msg, x.cfg.Limits)
	if err == nil {
		var r *region.Report
		if r, err = x.asm.Add(now, p); err == nil && r != nil {
			err = x.merge(ctx, now, r)
		}
	}
	if err == nil {
		return
	}
	reason, ok := codec.ReasonOf(err)
	if !ok {
		x.cfg.Logger.Error("exchange: receiving a report", "err", err)
		return
	}
	x.met.dropped.WithLabelValues(string(reason)).Inc()
	if reason != codec.ReasonStale && reason != codec.ReasonDuplicate {
		x.cfg.Logger.Debug("exchange: dropped a message", "reason", reason, "err", err)
	}
}

// merge handles a complete report: the Node merges it on the holder and
// writes the shares its gifts raised.
func (x *Exchanger) merge(ctx context.Context, now time.Time, r *region.Report) error {
	if r.Region == x.cfg.Region && r.Replica == x.cfg.Replica {
		return nil // our own echo
	}
	x.noteHeard(r.Region, now, r.Policy)
	if r.Region != x.cfg.Region {
		x.top.peerReport(r, x.cfg.TopKeys)
	}
	return x.node.Receive(ctx, now, r)
}

// limit is the allocator's limit of a key in the policy the epoch took.
func (x *Exchanger) limit(key string) lease.Limit {
	return service.Limit(x.pol.RuleOf(key), x.initial, x.cfg.Clock())
}

// drainTallies hands the tallies observed since the last epoch to the Node.
func (x *Exchanger) drainTallies() {
	for i := range x.tallies {
		s := &x.tallies[i]
		s.mu.Lock()
		m := s.m
		s.m = make(map[string]*[2]int64, len(m))
		s.mu.Unlock()
		for k, t := range m {
			x.node.Observe(k, t[0], t[1])
		}
	}
}
