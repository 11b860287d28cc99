package exchange

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/region"
)

// The Part decoder is written by hand over protowire: decoding through the
// generated code (proto.Unmarshal into *syncv1.Part, then converting to
// region.KeyReport) allocated a message per key and per exit and a slice per
// row, which made a 100,000-key epoch GC-bound. This one reads the body
// twice: a first pass checks the wire format exactly as proto.Unmarshal
// does and counts what the part holds, without allocating; the second
// carves every key's slices from one slab per element type. The generated
// decoder remains the reference: the tests and FuzzDecodeDifferential check
// that both accept the same bodies and produce the same Part.

// Field numbers of sync/v1's Part, Key and Exit (sync.proto).
const (
	fPartRegion    = 1
	fPartReplica   = 2
	fPartEpoch     = 3
	fPartSentAt    = 4
	fPartExchange  = 5
	fPartRegions   = 6
	fPartReportID  = 7
	fPartPart      = 8
	fPartParts     = 9
	fPartKeysTotal = 10
	fPartKeys      = 11

	fKeyKey        = 1
	fKeyGeneration = 2
	fKeyBase       = 3
	fKeyRow        = 4
	fKeyTaken      = 5
	fKeyIn         = 6
	fKeyInTaken    = 7
	fKeySharePPM   = 8
	fKeyDemand     = 9
	fKeyGranted    = 10
	fKeyExits      = 11
	fKeySettled    = 12

	fExitGeneration = 1
	fExitRow        = 2
	fExitTaken      = 3
	fExitIn         = 4
	fExitInTaken    = 5
)

// errWire is returned (as a negative length) for anything proto.Unmarshal
// would reject: a bad tag, varint, length, group or UTF-8 string.
const errWire = -1

// consumeTag is protowire.ConsumeTag with the field number range that
// proto.Unmarshal enforces (ConsumeTag accepts up to MaxInt32).
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	if len(b) > 0 && b[0] < 0x80 && b[0] >= 1<<3 { // every tag of ours
		return protowire.Number(b[0] >> 3), protowire.Type(b[0] & 7), 1
	}
	v, n := protowire.ConsumeVarint(b)
	if n < 0 || v>>3 < uint64(protowire.MinValidNumber) || v>>3 > uint64(protowire.MaxValidNumber) {
		return 0, 0, errWire
	}
	return protowire.Number(v >> 3), protowire.Type(v & 7), n
}

// consumeString consumes a proto3 string field, which must be UTF-8.
func consumeString(b []byte) ([]byte, int) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 || !utf8.Valid(v) {
		return nil, errWire
	}
	return v, n
}

// countVarints consumes a repeated varint field of type typ, packed or not
// as proto3 parsers must accept, and returns how many values it holds. A
// field of another wire type is an unknown field: skipped, no values.
func countVarints(typ protowire.Type, num protowire.Number, b []byte) (count, n int) {
	switch typ {
	case protowire.VarintType:
		_, n = protowire.ConsumeVarint(b)
		return 1, n
	case protowire.BytesType:
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, n
		}
		for len(v) > 0 {
			if v[0] < 0x80 {
				v = v[1:]
			} else {
				_, m := protowire.ConsumeVarint(v)
				if m < 0 {
					return 0, m
				}
				v = v[m:]
			}
			count++
		}
		return count, n
	}
	return 0, protowire.ConsumeFieldValue(num, typ, b)
}

// fillVarints is countVarints appending the values to dst. The first
// occurrence of a field takes its slice from slab; a later one, which no
// encoder of ours writes (they pack each field once), appends beyond it.
func fillVarints[T int64 | uint64](dst []T, slab *[]T, typ protowire.Type, num protowire.Number, b []byte) ([]T, int) {
	switch typ {
	case protowire.VarintType:
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return dst, n
		}
		if dst == nil {
			dst = carve(slab, 1)
		}
		return append(dst, T(v)), n
	case protowire.BytesType:
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return dst, n
		}
		if dst == nil {
			c := 0
			for _, x := range v {
				if x < 0x80 {
					c++
				}
			}
			dst = carve(slab, c)
		}
		for len(v) > 0 {
			if v[0] < 0x80 {
				dst = append(dst, T(v[0]))
				v = v[1:]
				continue
			}
			x, m := protowire.ConsumeVarint(v)
			if m < 0 {
				return dst, m
			}
			dst = append(dst, T(x))
			v = v[m:]
		}
		return dst, n
	}
	return dst, protowire.ConsumeFieldValue(num, typ, b)
}

// exitShape counts the values of one Exit message.
type exitShape struct {
	row, taken, in, inTaken int
}

func (s exitShape) ints() int { return s.row + s.taken + s.in + s.inTaken }

// scanExit checks an Exit message and counts its values.
func scanExit(b []byte) (s exitShape, ok bool) {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return s, false
		}
		b = b[n:]
		var c int
		switch num {
		case fExitRow:
			c, n = countVarints(typ, num, b)
			s.row += c
		case fExitTaken:
			c, n = countVarints(typ, num, b)
			s.taken += c
		case fExitIn:
			c, n = countVarints(typ, num, b)
			s.in += c
		case fExitInTaken:
			c, n = countVarints(typ, num, b)
			s.inTaken += c
		default: // generation is a varint like any other
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return s, false
		}
		b = b[n:]
	}
	return s, true
}

// keyShape counts the values of one Key message.
type keyShape struct {
	row, taken, in, inTaken int
	exitInts                int // int64 values in its exit records
	exits, settled          int
	key                     []byte // the last key field: proto3 keeps the last
}

func (s *keyShape) ints() int { return s.row + s.taken + s.in + s.inTaken + s.exitInts }

// scanKey checks a Key message and counts its values.
func scanKey(b []byte) (s keyShape, ok bool) {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return s, false
		}
		b = b[n:]
		var c int
		switch {
		case num == fKeyKey && typ == protowire.BytesType:
			s.key, n = consumeString(b)
		case num == fKeyRow:
			c, n = countVarints(typ, num, b)
			s.row += c
		case num == fKeyTaken:
			c, n = countVarints(typ, num, b)
			s.taken += c
		case num == fKeyIn:
			c, n = countVarints(typ, num, b)
			s.in += c
		case num == fKeyInTaken:
			c, n = countVarints(typ, num, b)
			s.inTaken += c
		case num == fKeySettled:
			c, n = countVarints(typ, num, b)
			s.settled += c
		case num == fKeyExits && typ == protowire.BytesType:
			var v []byte
			if v, n = protowire.ConsumeBytes(b); n >= 0 {
				x, ok := scanExit(v)
				if !ok {
					return s, false
				}
				s.exits++
				s.exitInts += x.ints()
			}
		default: // scalars and unknown fields
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return s, false
		}
		b = b[n:]
	}
	return s, true
}

// partShape is what the first pass learns of a Part body: its header, what
// its keys need allocated, and the first key that breaks the Limits.
type partShape struct {
	region, replica []byte
	epoch           uint64
	sentAt          int64
	exchange        bool
	regions         int
	longestRegion   int
	id              uint64
	part, parts     uint32
	keysTotal       uint32
	keys            int
	ints, uints     int
	exits           int
	badKey          error
	lim             Limits
}

// scanPart checks a Part body and fills s. It returns false when the body
// is not a Part that proto.Unmarshal would accept.
func (s *partShape) scan(b []byte) bool {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var v uint64
		switch {
		case num == fPartRegion && typ == protowire.BytesType:
			s.region, n = consumeString(b)
		case num == fPartReplica && typ == protowire.BytesType:
			s.replica, n = consumeString(b)
		case num == fPartRegions && typ == protowire.BytesType:
			var r []byte
			r, n = consumeString(b)
			s.regions++
			s.longestRegion = max(s.longestRegion, len(r))
		case num == fPartReportID && typ == protowire.Fixed64Type:
			s.id, n = protowire.ConsumeFixed64(b)
		case num == fPartKeys && typ == protowire.BytesType:
			var m []byte
			if m, n = protowire.ConsumeBytes(b); n >= 0 {
				k, ok := scanKey(m)
				if !ok {
					return false
				}
				s.key(&k)
			}
		case typ == protowire.VarintType && num >= fPartEpoch && num <= fPartKeysTotal && num != fPartRegions && num != fPartReportID:
			if v, n = protowire.ConsumeVarint(b); n >= 0 {
				s.varint(num, v)
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return false
		}
		b = b[n:]
	}
	return true
}

// varint sets the header field num, as proto.Unmarshal would: the last
// occurrence wins, and a uint32 keeps the low 32 bits.
func (s *partShape) varint(num protowire.Number, v uint64) {
	switch num {
	case fPartEpoch:
		s.epoch = v
	case fPartSentAt:
		s.sentAt = int64(v)
	case fPartExchange:
		s.exchange = v != 0
	case fPartPart:
		s.part = uint32(v)
	case fPartParts:
		s.parts = uint32(v)
	case fPartKeysTotal:
		s.keysTotal = uint32(v)
	}
}

// key adds one key's needs, and remembers the first key that breaks the
// Limits: it is reported after the header's problems, as DecodePart always
// has.
func (s *partShape) key(k *keyShape) {
	i := s.keys
	s.keys++
	s.ints += k.ints()
	s.uints += k.settled
	s.exits += k.exits
	if s.badKey != nil {
		return
	}
	switch {
	case len(k.key) > s.lim.MaxKeyBytes:
		s.badKey = drop(ReasonInconsistent, "key %d: %d bytes, more than %d", i, len(k.key), s.lim.MaxKeyBytes)
	case k.exits > s.lim.MaxExits:
		s.badKey = drop(ReasonInconsistent, "key %q: %d exit records, more than %d", k.key, k.exits, s.lim.MaxExits)
	}
}

// slabs hand out the slices of a part's keys, each with its capacity equal
// to its length so that a caller's append never writes into a neighbour.
type slabs struct {
	ints  []int64
	uints []uint64
	exits []region.Exit
}

func carve[T any](slab *[]T, n int) []T {
	if n == 0 {
		return nil
	}
	if n > len(*slab) {
		return make([]T, 0, n) // not reached: the first pass counted
	}
	v := (*slab)[:0:n]
	*slab = (*slab)[n:]
	return v
}

// fillExit decodes a checked Exit message into x.
func fillExit(b []byte, x *region.Exit, sl *slabs) bool {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == fExitGeneration && typ == protowire.VarintType:
			x.Generation, n = protowire.ConsumeVarint(b)
		case num == fExitRow:
			x.Row, n = fillVarints(x.Row, &sl.ints, typ, num, b)
		case num == fExitTaken:
			x.Taken, n = fillVarints(x.Taken, &sl.ints, typ, num, b)
		case num == fExitIn:
			x.In, n = fillVarints(x.In, &sl.ints, typ, num, b)
		case num == fExitInTaken:
			x.InTaken, n = fillVarints(x.InTaken, &sl.ints, typ, num, b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return false
		}
		b = b[n:]
	}
	return true
}

// fillKey decodes a checked Key message into k, except for its Key string,
// which it returns.
func fillKey(b []byte, k *region.KeyReport, sl *slabs) ([]byte, bool) {
	var key []byte
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		var v uint64
		switch {
		case num == fKeyRow:
			k.Row, n = fillVarints(k.Row, &sl.ints, typ, num, b)
		case num == fKeyTaken:
			k.Taken, n = fillVarints(k.Taken, &sl.ints, typ, num, b)
		case num == fKeyIn:
			k.In, n = fillVarints(k.In, &sl.ints, typ, num, b)
		case num == fKeyInTaken:
			k.InTaken, n = fillVarints(k.InTaken, &sl.ints, typ, num, b)
		case num == fKeySettled:
			k.Settled, n = fillVarints(k.Settled, &sl.uints, typ, num, b)
		case num == fKeyExits && typ == protowire.BytesType:
			var m []byte
			if m, n = protowire.ConsumeBytes(b); n >= 0 {
				if k.Exits == nil {
					// A key's exits are consecutive in the slab: the
					// rows of its exits come from the other slabs.
					k.Exits = sl.exits[:0]
				}
				k.Exits = append(k.Exits, region.Exit{})
				if !fillExit(m, &k.Exits[len(k.Exits)-1], sl) {
					return nil, false
				}
			}
		case num == fKeyKey && typ == protowire.BytesType:
			key, n = protowire.ConsumeBytes(b)
		case typ == protowire.VarintType:
			if v, n = protowire.ConsumeVarint(b); n >= 0 {
				keyVarint(k, num, v)
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return nil, false
		}
		b = b[n:]
	}
	if n := len(k.Exits); n > 0 {
		k.Exits = k.Exits[:n:n]
		sl.exits = sl.exits[min(n, len(sl.exits)):]
	}
	return key, true
}

func keyVarint(k *region.KeyReport, num protowire.Number, v uint64) {
	switch num {
	case fKeyGeneration:
		k.Generation = v
	case fKeyBase:
		k.Base = protowire.DecodeZigZag(v)
	case fKeySharePPM:
		k.SharePPM = int64(v)
	case fKeyDemand:
		k.Demand = int64(v)
	case fKeyGranted:
		k.Granted = int64(v)
	}
}

// keyChunk is the most bytes of key strings allocated together. Receivers
// keep the strings of the keys they hold (region.State, the top-keys
// gauges), and a kept string keeps its whole allocation alive: one string
// per part would pin the part's keys for as long as any one of them lives.
// Sharing an allocation between the keys of a few hundred bytes bounds that
// waste to a few hundred bytes per kept key, which holds far more than that
// in region.State, and still allocates an order of magnitude less often
// than a string per key.
const keyChunk = 256

// keyStrings gives keys their strings, a chunk at a time.
type keyStrings struct {
	buf  []byte
	idx  []int // of the keys whose strings are in buf
	ends []int
}

func (ks *keyStrings) add(keys []region.KeyReport, i int, key []byte) {
	switch {
	case len(key) == 0:
		return
	case len(key) > keyChunk/2:
		keys[i].Key = string(key)
		return
	case len(ks.buf)+len(key) > keyChunk:
		ks.flush(keys)
	}
	ks.buf = append(ks.buf, key...)
	ks.idx = append(ks.idx, i)
	ks.ends = append(ks.ends, len(ks.buf))
}

func (ks *keyStrings) flush(keys []region.KeyReport) {
	s := string(ks.buf)
	start := 0
	for j, i := range ks.idx {
		keys[i].Key = s[start:ks.ends[j]]
		start = ks.ends[j]
	}
	ks.buf, ks.idx, ks.ends = ks.buf[:0], ks.idx[:0], ks.ends[:0]
}

// decodeBody decodes a Part body into p, checking it against lim (with
// defaults). Any error is a *DropError.
func decodeBody(body []byte, lim Limits, p *Part) error {
	corrupt := func() error { return drop(ReasonCorrupt, "part: invalid wire-format data") }
	s := partShape{lim: lim}
	if !s.scan(body) {
		return corrupt()
	}
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
	case s.badKey != nil:
		return s.badKey
	}

	// Everything is checked: the second pass cannot fail on a body the
	// first accepted, but is written to drop rather than trust it.
	p.Header = region.Report{
		Region:   string(s.region),
		Replica:  string(s.replica),
		Epoch:    s.epoch,
		SentAt:   fromUnixNano(s.sentAt),
		Exchange: s.exchange,
	}
	p.ID, p.Index, p.Count, p.KeysTotal = s.id, int(s.part), int(s.parts), int(s.keysTotal)
	if s.regions > 0 {
		p.Header.Regions = make([]string, 0, s.regions)
	}
	var (
		sl   slabs
		strs keyStrings
	)
	if s.keys > 0 {
		p.Keys = make([]region.KeyReport, s.keys)
		sl.ints = make([]int64, s.ints)
		sl.uints = make([]uint64, s.uints)
		sl.exits = make([]region.Exit, s.exits)
		strs.buf = make([]byte, 0, keyChunk)
	}
	i := 0 // the next key
	for b := body; len(b) > 0; {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return corrupt()
		}
		b = b[n:]
		switch {
		case num == fPartRegions && typ == protowire.BytesType:
			var r []byte
			if r, n = protowire.ConsumeBytes(b); n >= 0 {
				p.Header.Regions = append(p.Header.Regions, string(r))
			}
		case num == fPartKeys && typ == protowire.BytesType:
			var m []byte
			if m, n = protowire.ConsumeBytes(b); n >= 0 {
				if i == len(p.Keys) {
					return corrupt() // not reached: the first pass counted
				}
				key, ok := fillKey(m, &p.Keys[i], &sl)
				if !ok {
					return corrupt()
				}
				strs.add(p.Keys, i, key)
				i++
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return corrupt()
		}
		b = b[n:]
	}
	strs.flush(p.Keys)
	return nil
}
