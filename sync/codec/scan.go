package codec

import (
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/region"
)

// The first pass of the Part decoder: it checks the wire format exactly as
// proto.Unmarshal does and counts what the part holds, without allocating.

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
	tokens                  int
	exitInts                int // int64 values in its exit records
	exits, settled          int
	key                     []byte // the last key field: proto3 keeps the last
}

func (s *keyShape) ints() int { return s.row + s.taken + s.in + s.inTaken + s.tokens + s.exitInts }

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
		case num == fKeyTokens:
			c, n = countVarints(typ, num, b)
			s.tokens += c
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
	refresh         uint32
	refreshFrom     uint32
	refreshCount    uint32
	since           uint64
	prev, resent    uint64
	resend          int
	longestResend   int
	policy          []byte
	rules           int
	longestRule     int
	keys            int
	reads           uint64
	cols            [nColumns]int // values of each varint column (V2)
	names           []byte        // the names column (V2)
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
		case num == fPartResend && typ == protowire.BytesType:
			var r []byte
			r, n = consumeString(b)
			s.resend++
			s.longestResend = max(s.longestResend, len(r))
		case num == fPartPolicy && typ == protowire.BytesType:
			s.policy, n = consumeString(b)
		case num == fPartRules && typ == protowire.BytesType:
			var m []byte
			if m, n = protowire.ConsumeBytes(b); n >= 0 {
				var d region.RuleDef
				name, ok := decodeRule(m, &d)
				if !ok {
					return false
				}
				s.rules++
				s.longestRule = max(s.longestRule, len(name))
			}
		case num == fColNames && typ == protowire.BytesType:
			s.names, n = protowire.ConsumeBytes(b)
		case num >= fColNameLens && num <= fColLengths && num != fColNames:
			var c int
			c, n = countVarints(typ, num, b)
			s.cols[num-fColNameLens] += c
		case num == fPartReads && typ == protowire.VarintType:
			s.reads, n = protowire.ConsumeVarint(b)
		case typ == protowire.VarintType && (num >= fPartEpoch && num <= fPartKeysTotal && num != fPartRegions && num != fPartReportID || num >= fPartRefresh && num <= fPartResent):
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
	case fPartRefresh:
		s.refresh = uint32(v)
	case fPartRefFrom:
		s.refreshFrom = uint32(v)
	case fPartRefCount:
		s.refreshCount = uint32(v)
	case fPartSince:
		s.since = v
	case fPartPrev:
		s.prev = v
	case fPartResent:
		s.resent = v
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
