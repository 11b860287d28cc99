package codec

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
	reads Version
}

type pending struct {
	hdr   region.Report
	reads Version
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
	if err := a.fresh(sk, p.Header.Epoch); err != nil {
		return nil, err
	}
	if p.Count == 1 {
		if len(p.Keys) != p.KeysTotal {
			return nil, drop(ReasonInconsistent, "%d keys in a report of %d", len(p.Keys), p.KeysTotal)
		}
		r := p.Header
		r.Keys = p.Keys
		a.complete(now, sk, p.ID, r.Epoch, p.Reads)
		return &r, nil
	}
	pk := pendingKey{sk, p.ID}
	pd, err := a.buffer(now, pk, p)
	if err != nil {
		return nil, err
	}
	if pd.got < pd.count {
		return nil, nil
	}
	a.remove(pk, pd)
	return a.join(now, pk, pd)
}

// fresh drops a part of a report that is not newer than the sender's
// newest complete one.
func (a *Assembler) fresh(sk senderKey, epoch uint64) error {
	s := a.senders[sk]
	switch {
	case s == nil:
		return nil
	case epoch < s.epoch:
		return drop(ReasonReplayed, "%s/%s epoch %d, have %d", sk.region, sk.replica, epoch, s.epoch)
	case epoch == s.epoch:
		return drop(ReasonDuplicate, "%s/%s epoch %d already received", sk.region, sk.replica, epoch)
	}
	return nil
}

// buffer keeps p with the other parts of its report, starting the report
// if p is its first part to arrive.
func (a *Assembler) buffer(now time.Time, pk pendingKey, p *Part) (*pending, error) {
	pd := a.pending[pk]
	if pd != nil {
		if err := pd.admit(pk, p); err != nil {
			return nil, err
		}
	} else if a.bytes+p.Size > a.cfg.MaxPendingBytes {
		a.Expire(now) // a new report may take the room of expired ones
	}
	if a.bytes+p.Size > a.cfg.MaxPendingBytes {
		return nil, drop(ReasonOverflow, "reassembly buffer holds %d bytes", a.bytes)
	}
	if pd == nil {
		pd = &pending{
			hdr:   p.Header,
			reads: p.Reads,
			count: p.Count,
			total: p.KeysTotal,
			parts: make([][]region.KeyReport, p.Count),
			have:  make([]bool, p.Count),
			first: now,
		}
		a.pending[pk] = pd
	}
	pd.parts[p.Index], pd.have[p.Index] = p.Keys, true
	pd.got++
	pd.bytes += p.Size
	a.bytes += p.Size
	return pd, nil
}

// admit drops a part that contradicts the parts already buffered, or
// repeats one.
func (pd *pending) admit(pk pendingKey, p *Part) error {
	h, sk := &pd.hdr, pk.sender
	if p.Count != pd.count || p.KeysTotal != pd.total || p.Reads != pd.reads || p.Header.Epoch != h.Epoch ||
		p.Header.Exchange != h.Exchange || !p.Header.SentAt.Equal(h.SentAt) || !slices.Equal(p.Header.Regions, h.Regions) ||
		p.Header.Refresh != h.Refresh || p.Header.RefreshFrom != h.RefreshFrom || p.Header.RefreshCount != h.RefreshCount || p.Header.Since != h.Since ||
		p.Header.Prev != h.Prev || p.Header.Resent != h.Resent || !slices.Equal(p.Header.Resend, h.Resend) ||
		p.Header.Policy != h.Policy || !slices.Equal(p.Header.Rules, h.Rules) {
		return drop(ReasonInconsistent, "part %d of report %x from %s/%s contradicts its other parts", p.Index, p.ID, sk.region, sk.replica)
	}
	if pd.have[p.Index] {
		return drop(ReasonDuplicate, "part %d of report %x from %s/%s", p.Index, p.ID, sk.region, sk.replica)
	}
	return nil
}

// join makes the report of a pending one whose parts have all arrived.
func (a *Assembler) join(now time.Time, pk pendingKey, pd *pending) (*region.Report, error) {
	sk := pk.sender
	n := 0
	for _, ks := range pd.parts {
		n += len(ks)
	}
	if n != pd.total {
		return nil, drop(ReasonInconsistent, "report %x from %s/%s: %d keys in its parts, %d announced", pk.id, sk.region, sk.replica, n, pd.total)
	}
	r := pd.hdr
	if n > 0 {
		r.Keys = make([]region.KeyReport, 0, n)
	}
	for _, ks := range pd.parts {
		r.Keys = append(r.Keys, ks...)
	}
	a.complete(now, sk, pk.id, r.Epoch, pd.reads)
	return &r, nil
}

// complete records a complete report and forgets the sender's older
// incomplete ones, which can only be dropped as replays now.
func (a *Assembler) complete(now time.Time, sk senderKey, id, epoch uint64, reads Version) {
	s := a.senders[sk]
	if s == nil {
		if len(a.senders) >= a.cfg.MaxSenders {
			a.forgetOldestSender()
		}
		s = &sender{}
		a.senders[sk] = s
	}
	s.epoch, s.id, s.heard, s.reads = epoch, id, now, reads
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

// WriteVersion is the wire version a sender should write at now, given the
// reports it has assembled: Latest once every region of peers has a
// replica heard within the last within and every replica heard within it
// reads Latest, V1 otherwise (docs/DESIGN.md, "Reports are deltas",
// Upgrades). A replica that starts on an older version loses the reports
// sent before its first is heard: a delta lost, asked for again.
func (a *Assembler) WriteVersion(now time.Time, peers []string, within time.Duration) Version {
	v := Latest
	for _, s := range a.senders {
		if now.Sub(s.heard) <= within {
			v = min(v, s.reads)
		}
	}
	if v == V1 {
		return V1
	}
	for _, r := range peers {
		heard := false
		for sk, s := range a.senders {
			if sk.region == r && now.Sub(s.heard) <= within {
				heard = true
				break
			}
		}
		if !heard {
			return V1
		}
	}
	return v
}
