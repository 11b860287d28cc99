package codec

import (
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/region"
)

// The second pass of the Part decoder: on a body the first pass checked,
// it carves every key's slices from one slab per element type.

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
		case num == fKeyTokens:
			k.Tokens, n = fillVarints(k.Tokens, &sl.ints, typ, num, b)
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
	case fKeyTokensWin:
		k.TokensWindow = int64(v)
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

// fillPart decodes the regions and keys of a body that s describes into p,
// whose header s has set.
func fillPart(body []byte, s *partShape, p *Part) error {
	var (
		sl   slabs
		strs keyStrings
	)
	if s.keys > 0 {
		sl.ints = make([]int64, s.ints)
		sl.uints = make([]uint64, s.uints)
		sl.exits = make([]region.Exit, s.exits)
		strs.buf = make([]byte, 0, keyChunk)
	}
	i := 0 // the next key
	for b := body; len(b) > 0; {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return corruptPart()
		}
		b = b[n:]
		switch {
		case num == fPartRegions && typ == protowire.BytesType:
			var r []byte
			if r, n = protowire.ConsumeBytes(b); n >= 0 {
				p.Header.Regions = append(p.Header.Regions, string(r))
			}
		case num == fPartResend && typ == protowire.BytesType:
			var r []byte
			if r, n = protowire.ConsumeBytes(b); n >= 0 {
				p.Header.Resend = append(p.Header.Resend, string(r))
			}
		case num == fPartRules && typ == protowire.BytesType:
			var m []byte
			if m, n = protowire.ConsumeBytes(b); n >= 0 {
				var d region.RuleDef
				name, ok := decodeRule(m, &d)
				if !ok {
					return corruptPart()
				}
				d.Name = string(name)
				p.Header.Rules = append(p.Header.Rules, d)
			}
		case num == fPartKeys && typ == protowire.BytesType:
			var m []byte
			if m, n = protowire.ConsumeBytes(b); n >= 0 {
				if i == len(p.Keys) {
					return corruptPart() // not reached: the first pass counted
				}
				key, ok := fillKey(m, &p.Keys[i], &sl)
				if !ok {
					return corruptPart()
				}
				strs.add(p.Keys, i, key)
				i++
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return corruptPart()
		}
		b = b[n:]
	}
	strs.flush(p.Keys)
	return nil
}
