package exchange

import "time"

// spent is where the time of a holder's epoch went, logged when the epoch
// outlasts its period: the store's calls, the wire's, and the Node's own
// work (the rest of the decide phase), and the reports merged since the
// epoch before (issue 12).
type spent struct {
	hold, incarnation, writes, save, load, publish, receive time.Duration
	tally, decide                                           time.Duration
	node                                                    time.Duration // the Node's own work in the phases
}

// effects is the time of the calls out of the Node.
func (sp spent) effects() time.Duration {
	return sp.hold + sp.incarnation + sp.writes + sp.save + sp.load + sp.publish
}

// since adds the time since start to *d.
func since(d *time.Duration, start time.Time) { *d += time.Since(start) }

// noteSpent logs where a long holder's epoch went, and starts the next.
func (x *Exchanger) noteSpent(holder bool) {
	sp := x.spent
	x.spent = spent{}
	if !holder || sp.tally+sp.decide <= x.cfg.Period {
		return
	}
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	x.cfg.Logger.Info("exchange: an epoch outlasted its period",
		"keys", x.node.Keys(), "tally_ms", ms(sp.tally), "decide_ms", ms(sp.decide),
		"hold_ms", ms(sp.hold), "incarnation_ms", ms(sp.incarnation), "writes_ms", ms(sp.writes),
		"save_ms", ms(sp.save), "load_ms", ms(sp.load), "publish_ms", ms(sp.publish),
		"node_ms", ms(sp.node), "receive_ms", ms(sp.receive))
}
