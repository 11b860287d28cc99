package exchange

import (
	"slices"
	"time"

	"github.com/ration-dev/ration/region"
)

// AssemblerConfig configures an Assembler. The zero value of a field means
// its default.
type AssemblerConfig struct {
	// Timeout is how long the parts of an incomplete report are kept
	// after its first part arrived (default 2s; the Exchanger uses two
	// sync periods).
	Timeout time.Duration
	// MaxPendingBytes bounds the message bytes buffered for incomplete
	// reports (default 64 MiB). A part that would exceed it is dropped
	// (ReasonOverflow).
	MaxPendingBytes int
	// MaxSenders bounds the replicas remembered for replay detection
	// (default 4096); beyond it the least recently heard is forgotten.
	MaxSenders int
}

func (c AssemblerConfig) withDefaults() AssemblerConfig {
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.MaxPendingBytes <= 0 {
		c.MaxPendingBytes = 64 << 20
	}
	if c.MaxSenders <= 0 {
		c.MaxSenders = 4096
	}
	return c
}

// Assembler merges the parts of reports into whole reports, and drops
// duplicates and replays. It is a pure state machine: the time is an
// argument. Not safe for concurrent use; the Exchanger's loop owns it.
type Assembler struct {
	cfg     AssemblerConfig
	pending map[pendingKey]*pending
	bytes   int
	senders map[senderKey]*sender
}

// senderKey names a sequence of reports: a replica's tally-only reports and
// its exchange reports are numbered by the same epochs, one of each an epoch.
type senderKey struct {
	region, replica string
	exchange        bool
}

type pendingKey struct {
	sender senderKey
	id     uint64
}

// sender is what we remember of one replica: its newest complete report.
type sender struct {
	epoch uint64
	id    uint64
	heard time.Time
}

type pending struct {
	hdr   region.Report
	count int
	total int
	parts [][]region.KeyReport
	have  []bool
	got   int
	bytes int
	first time.Time
}

// NewAssembler returns an empty Assembler.
func NewAssembler(cfg AssemblerConfig) *Assembler {
	return &Assembler{
		cfg:     cfg.withDefaults(),
		pending: make(map[pendingKey]*pending),
		senders: make(map[senderKey]*sender),
	}
}

// Add takes one decoded part received at now. It returns the whole report
// when p completes one (a single-part report completes at once), nil while
// parts are missing, and a *DropError when p is dropped: a duplicate part,
// a part of a report already complete or older than one complete from the
// same replica, a header that contradicts the report's other parts, a key
// count that does not add up, or a full buffer.
func (a *Assembler) Add(now time.Time, p *Part) (*region.Report, error) {
	sk := senderKey{p.Header.Region, p.Header.Replica, p.Header.Exchange}
	if s := a.senders[sk]; s != nil {
		switch {
		case p.Header.Epoch < s.epoch:
			return nil, drop(ReasonReplayed, "%s/%s epoch %d, have %d", sk.region, sk.replica, p.Header.Epoch, s.epoch)
		case p.Header.Epoch == s.epoch:
			return nil, drop(ReasonDuplicate, "%s/%s epoch %d already received", sk.region, sk.replica, p.Header.Epoch)
		}
	}
	if p.Count == 1 {
		if len(p.Keys) != p.KeysTotal {
			return nil, drop(ReasonInconsistent, "%d keys in a report of %d", len(p.Keys), p.KeysTotal)
		}
		r := p.Header
		r.Keys = p.Keys
		a.complete(now, sk, p.ID, r.Epoch)
		return &r, nil
	}

	pk := pendingKey{sk, p.ID}
	pd := a.pending[pk]
	if pd == nil {
		if a.bytes+p.Size > a.cfg.MaxPendingBytes {
			a.Expire(now)
			if a.bytes+p.Size > a.cfg.MaxPendingBytes {
				return nil, drop(ReasonOverflow, "reassembly buffer holds %d bytes", a.bytes)
			}
		}
		pd = &pending{
			hdr:   p.Header,
			count: p.Count,
			total: p.KeysTotal,
			parts: make([][]region.KeyReport, p.Count),
			have:  make([]bool, p.Count),
			first: now,
		}
		a.pending[pk] = pd
	} else {
		h := &pd.hdr
		if p.Count != pd.count || p.KeysTotal != pd.total || p.Header.Epoch != h.Epoch ||
			p.Header.Exchange != h.Exchange || !p.Header.SentAt.Equal(h.SentAt) || !slices.Equal(p.Header.Regions, h.Regions) {
			return nil, drop(ReasonInconsistent, "part %d of report %x from %s/%s contradicts its other parts", p.Index, p.ID, sk.region, sk.replica)
		}
		if pd.have[p.Index] {
			return nil, drop(ReasonDuplicate, "part %d of report %x from %s/%s", p.Index, p.ID, sk.region, sk.replica)
		}
		if a.bytes+p.Size > a.cfg.MaxPendingBytes {
			return nil, drop(ReasonOverflow, "reassembly buffer holds %d bytes", a.bytes)
		}
	}
	pd.parts[p.Index], pd.have[p.Index] = p.Keys, true
	pd.got++
	pd.bytes += p.Size
	a.bytes += p.Size
	if pd.got < pd.count {
		return nil, nil
	}

	a.remove(pk, pd)
	n := 0
	for _, ks := range pd.parts {
		n += len(ks)
	}
	if n != pd.total {
		return nil, drop(ReasonInconsistent, "report %x from %s/%s: %d keys in its parts, %d announced", p.ID, sk.region, sk.replica, n, pd.total)
	}
	r := pd.hdr
	if n > 0 {
		r.Keys = make([]region.KeyReport, 0, n)
	}
	for _, ks := range pd.parts {
		r.Keys = append(r.Keys, ks...)
	}
	a.complete(now, sk, p.ID, r.Epoch)
	return &r, nil
}

// complete records a complete report and forgets the sender's older
// incomplete ones, which can only be dropped as replays now.
func (a *Assembler) complete(now time.Time, sk senderKey, id, epoch uint64) {
	s := a.senders[sk]
	if s == nil {
		if len(a.senders) >= a.cfg.MaxSenders {
			a.forgetOldestSender()
		}
		s = &sender{}
		a.senders[sk] = s
	}
	s.epoch, s.id, s.heard = epoch, id, now
	for pk, pd := range a.pending {
		if pk.sender == sk && pd.hdr.Epoch <= epoch {
			a.remove(pk, pd)
		}
	}
}

func (a *Assembler) forgetOldestSender() {
	var oldest senderKey
	var at time.Time
	first := true
	for k, s := range a.senders {
		if first || s.heard.Before(at) {
			oldest, at, first = k, s.heard, false
		}
	}
	delete(a.senders, oldest)
}

func (a *Assembler) remove(pk pendingKey, pd *pending) {
	delete(a.pending, pk)
	a.bytes -= pd.bytes
}

// Expire drops the incomplete reports whose first part arrived more than
// Timeout before now, and returns how many parts it dropped.
func (a *Assembler) Expire(now time.Time) int {
	n := 0
	for pk, pd := range a.pending {
		if now.Sub(pd.first) > a.cfg.Timeout {
			n += pd.got
			a.remove(pk, pd)
		}
	}
	return n
}

// PendingBytes returns the message bytes buffered for incomplete reports.
func (a *Assembler) PendingBytes() int { return a.bytes }
