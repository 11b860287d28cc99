package codec

import "github.com/ration-dev/ration/region"

// The Part decoder is written by hand over protowire: decoding through the
// generated code (proto.Unmarshal into *syncv1.Part, then converting to
// region.KeyReport) allocated a message per key and per exit and a slice per
// row, which made a 100,000-key epoch GC-bound. This one reads the body
// twice: a first pass (scan.go) checks the wire format exactly as
// proto.Unmarshal does and counts what the part holds, without allocating;
// the second (fill.go) carves every key's slices from one slab per element
// type. The generated decoder remains the reference: the tests and
// FuzzDecodeDifferential check that both accept the same bodies and produce
// the same Part.

// Part is one decoded message: a part of a replica's report.
type Part struct {
	// Header holds the report's header fields; Keys is nil.
	Header region.Report
	// ID, Index and Count are the report id and this part's place.
	ID           uint64
	Index, Count int
	// KeysTotal is the number of keys in the whole report.
	KeysTotal int
	// Keys are this part's keys.
	Keys []region.KeyReport
	// Size is the message's size in bytes.
	Size int
	// Version is the message's wire version, and Reads the newest the
	// sender reads (V1 when it does not say: it predates V2).
	Version, Reads Version
}

// DecodePart decodes one message, checking it against lim. It never
// panics; any problem is a *DropError naming the reason. The slices of the
// result do not alias msg. The slices of its keys are carved from a few
// shared allocations (fill.go), each with its capacity equal to its
// length, so that appending to one never writes into another.
func DecodePart(msg []byte, lim Limits) (*Part, error) {
	lim = lim.withDefaults()
	if len(msg) > lim.MaxMessageBytes {
		return nil, drop(ReasonOversized, "%d bytes, more than %d", len(msg), lim.MaxMessageBytes)
	}
	body, v, err := openEnvelopeVersion(msg)
	if err != nil {
		return nil, err
	}
	p := &Part{Size: len(msg), Version: v}
	if err := decodeBody(body, lim, v, p); err != nil {
		return nil, err
	}
	return p, nil
}

// decodeBody decodes a Part body of version v into p, checking it against
// lim (with defaults). Any error is a *DropError.
func decodeBody(body []byte, lim Limits, v Version, p *Part) error {
	s := partShape{lim: lim}
	if !s.scan(body) {
		return corruptPart()
	}
	if v >= V2 {
		// V2's and V3's keys are their columns; a V1 key in them is not
		// ours.
		if s.keys > 0 {
			return drop(ReasonInconsistent, "a version %d part with version 1 keys", v)
		}
		s.keys = s.cols[cFlags]
	}
	if err := s.check(); err != nil {
		return err
	}
	// Everything is checked: the second pass cannot fail on a body the
	// first accepted, but is written to drop rather than trust it. The
	// columns are checked as they are read.
	s.header(p)
	if err := fillPart(body, &s, p); err != nil {
		return err
	}
	if v >= V2 {
		return fillColumns(body, &s, p, v)
	}
	return nil
}

func corruptPart() error { return drop(ReasonCorrupt, "part: invalid wire-format data") }

// check holds what the first pass found against the Limits, and the header
// against itself.
func (s *partShape) check() error {
	lim := s.lim
	bad := func(format string, args ...any) error { return drop(ReasonInconsistent, format, args...) }
	switch {
	case len(s.region) == 0 || len(s.region) > lim.MaxNameBytes:
		return bad("region name of %d bytes", len(s.region))
	case len(s.replica) == 0 || len(s.replica) > lim.MaxNameBytes:
		return bad("replica name of %d bytes", len(s.replica))
	case s.parts == 0 || s.part >= s.parts:
		return bad("part %d of %d", s.part, s.parts)
	case int64(s.parts) > int64(lim.MaxParts):
		return drop(ReasonOversized, "%d parts, more than %d", s.parts, lim.MaxParts)
	case int64(s.keysTotal) > int64(lim.MaxKeys):
		return drop(ReasonOversized, "%d keys, more than %d", s.keysTotal, lim.MaxKeys)
	case s.keys > int(s.keysTotal):
		return bad("part holds %d keys of a report of %d", s.keys, s.keysTotal)
	case s.regions > maxRegions:
		return bad("%d regions, more than %d", s.regions, maxRegions)
	case s.longestRegion > lim.MaxNameBytes:
		return bad("region name of %d bytes", s.longestRegion)
	case s.resend > maxResend:
		return bad("%d resend requests, more than %d", s.resend, maxResend)
	case s.longestResend > maxResendBytes(lim):
		return bad("resend request of %d bytes", s.longestResend)
	case len(s.policy) > lim.MaxNameBytes:
		return bad("policy name of %d bytes", len(s.policy))
	case s.rules > maxRules:
		return bad("%d rule definitions, more than %d", s.rules, maxRules)
	case s.longestRule > lim.MaxNameBytes:
		return bad("rule name of %d bytes", s.longestRule)
	}
	return s.badKey
}

// header sets p's header fields from s, and allocates its keys and the
// room for its regions.
func (s *partShape) header(p *Part) {
	p.Header = region.Report{
		Region:   string(s.region),
		Replica:  string(s.replica),
		Epoch:    s.epoch,
		SentAt:   fromUnixNano(s.sentAt),
		Exchange: s.exchange,
		Refresh:  s.refresh, RefreshFrom: s.refreshFrom, RefreshCount: s.refreshCount, Since: s.since,
		Prev: s.prev, Resent: s.resent,
		Policy: string(s.policy),
	}
	p.ID, p.Index, p.Count, p.KeysTotal = s.id, int(s.part), int(s.parts), int(s.keysTotal)
	p.Reads = max(V1, Version(uint32(s.reads)))
	if s.regions > 0 {
		p.Header.Regions = make([]string, 0, s.regions)
	}
	if s.resend > 0 {
		p.Header.Resend = make([]string, 0, s.resend)
	}
	if s.rules > 0 {
		p.Header.Rules = make([]region.RuleDef, 0, s.rules)
	}
	if s.keys > 0 {
		p.Keys = make([]region.KeyReport, s.keys)
	}
}
