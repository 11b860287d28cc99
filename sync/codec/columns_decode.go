package codec

import (
	"math/bits"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/region"
)

// The decoder of version 2's key columns (columns.go). The first pass
// (scan.go) has checked the body's wire format and counted each column's
// values; fillColumns reads the keys from the columns, checking that they
// add up, against Limits and as names, in the order of the keys.

// column reads one repeated varint field of a checked body in order, across
// every occurrence of it, packed or not, as proto.Unmarshal concatenates
// them.
type column struct {
	rest []byte // the body after the current occurrence
	cur  []byte // what is left of the current packed occurrence
	num  protowire.Number
	left int // values not read yet
}

func newColumn(body []byte, num protowire.Number, count int) column {
	return column{rest: body, num: num, left: count}
}

func (c *column) next() (uint64, bool) {
	if c.left == 0 {
		return 0, false
	}
	for len(c.cur) == 0 {
		num, typ, n := consumeTag(c.rest)
		if n < 0 {
			return 0, false // not reached: the body was checked
		}
		c.rest = c.rest[n:]
		switch {
		case num == c.num && typ == protowire.BytesType:
			c.cur, n = protowire.ConsumeBytes(c.rest)
		case num == c.num && typ == protowire.VarintType:
			var v uint64
			if v, n = protowire.ConsumeVarint(c.rest); n >= 0 {
				c.rest = c.rest[n:]
				c.left--
				return v, true
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, c.rest)
		}
		if n < 0 {
			return 0, false
		}
		c.rest = c.rest[n:]
	}
	if b := c.cur[0]; b < 0x80 {
		c.cur = c.cur[1:]
		c.left--
		return uint64(b), true
	}
	v, n := protowire.ConsumeVarint(c.cur)
	if n < 0 {
		return 0, false
	}
	c.cur = c.cur[n:]
	c.left--
	return v, true
}

// colReader reads the keys of a part from its columns.
type colReader struct {
	col   [nColumns]column
	names []byte // what is left of the names column
	name  []byte // the previous key's name
	sh    shape
	lim   Limits
}

func columnsDrop() error { return drop(ReasonCorrupt, "part: key columns do not add up") }

// rowLens are the lengths of a key's six rows: Row, Taken, In, InTaken,
// Tokens, Settled.
func (cr *colReader) rowLens(flags uint64) ([6]int, bool) {
	var l [6]int
	if flags&kShape != 0 {
		if flags&kRows != 0 {
			return l, false
		}
		for i := range l {
			v, ok := cr.col[cLengths].next()
			if !ok || v > uint64(cr.col[cValues].left) {
				return l, false
			}
			l[i] = int(v)
		}
		return l, true
	}
	for i, f := range [6]uint64{kRow, kTaken, kIn, kInTaken, kTokens, kSettled} {
		if flags&f != 0 {
			l[i] = cr.sh.n
		}
	}
	return l, true
}

// written is the values a row of l entries takes, less the one at skip.
func written(l, skip int) int {
	if skip >= 0 {
		return l - 1
	}
	return l
}

// ints reads a row of l entries, carved from slab, the one at skip (-1:
// none) a zero the wire leaves out.
func (cr *colReader) ints(l, skip int, slab *[]int64) ([]int64, bool) {
	if l == 0 {
		return nil, true
	}
	if written(l, skip) > cr.col[cValues].left {
		return nil, false
	}
	v := carve(slab, l)
	for j := range l {
		var x uint64
		if j != skip {
			x, _ = cr.col[cValues].next()
		}
		v = append(v, int64(x))
	}
	return v, true
}

// uints is ints for Settled, which is rare: allocated.
func (cr *colReader) uints(l, skip int) ([]uint64, bool) {
	if l == 0 {
		return nil, true
	}
	if written(l, skip) > cr.col[cValues].left {
		return nil, false
	}
	v := make([]uint64, l)
	for j := range v {
		if j != skip {
			v[j], _ = cr.col[cValues].next()
		}
	}
	return v, true
}

// sparse reads a regular row of a sparse part (columns.go, sparseHead) into
// v, which has the row's n entries, all zero. It fails on a row that is not
// as the encoder writes it: a head without a mask that is not 0, a mask
// whose first entry is 0, a later entry written 0.
func (cr *colReader) sparse(v []uint64) bool {
	col := &cr.col[cValues]
	head, ok := col.next()
	if !ok {
		return false
	}
	mask := head & (1<<cr.sh.m - 1)
	if mask == 0 {
		return head == 0
	}
	first := head >> cr.sh.m
	if first == 0 {
		return false
	}
	bit := 0
	for j := range v {
		if j == cr.sh.self {
			continue
		}
		if mask>>bit&1 != 0 {
			if first != 0 {
				v[j], first = first, 0
			} else if v[j], ok = col.next(); !ok || v[j] == 0 {
				return false
			}
		}
		bit++
	}
	return true
}

// sparseInts is ints for a regular row of a sparse part (l entries, l > 0).
func (cr *colReader) sparseInts(l int, slab *[]int64) ([]int64, bool) {
	var buf [maxSparse + 1]uint64
	if l > len(buf) || !cr.sparse(buf[:l]) {
		return nil, false
	}
	v := carve(slab, l)
	for _, x := range buf[:l] {
		v = append(v, int64(x))
	}
	return v, true
}

// row reads a row of l entries of a key (int64; Settled is read by
// settled): sparse when the part is and the row regular, else less the
// entry at skip.
func (cr *colReader) row(l, skip int, regular bool, slab *[]int64) ([]int64, bool) {
	if l > 0 && regular && cr.sh.sparse {
		return cr.sparseInts(l, slab)
	}
	return cr.ints(l, skip, slab)
}

// settled is row for Settled.
func (cr *colReader) settled(l, skip int, regular bool) ([]uint64, bool) {
	if l > 0 && regular && cr.sh.sparse {
		if l > maxSparse+1 {
			return nil, false // not reached: a regular row has n entries
		}
		v := make([]uint64, l)
		return v, cr.sparse(v)
	}
	return cr.uints(l, skip)
}

// scalar reads the next scalar if flags has f, and is 0 otherwise.
func (cr *colReader) scalar(flags, f uint64) (uint64, bool) {
	if flags&f == 0 {
		return 0, true
	}
	return cr.col[cScalars].next()
}

// fullName reads the name of key i as the length of the prefix it shares
// with the previous one and the rest.
func (cr *colReader) fullName(i int) error {
	pre, ok1 := cr.col[cNameLens].next()
	suf, ok2 := cr.col[cNameLens].next()
	if !ok1 || !ok2 || pre > uint64(len(cr.name)) || suf > uint64(len(cr.names)) {
		return columnsDrop()
	}
	if l := pre + suf; l > uint64(cr.lim.MaxKeyBytes) {
		return drop(ReasonInconsistent, "key %d: %d bytes, more than %d", i, l, cr.lim.MaxKeyBytes)
	}
	cr.name = append(cr.name[:pre], cr.names[:suf]...)
	cr.names = cr.names[suf:]
	if !utf8.Valid(cr.name) {
		return corruptPart()
	}
	return nil
}

// key reads key i into k, prev being the key before it in the part (nil for
// the first), and returns its name.
func (cr *colReader) key(i int, k, prev *region.KeyReport, sl *slabs) ([]byte, error) {
	w, ok := cr.col[cFlags].next()
	known := uint64(kKnown)
	if cr.sh.v3 {
		known = kKnown3
	}
	if !ok || w&^known != 0 {
		return nil, columnsDrop()
	}
	flags := flagsOfWire(w, cr.sh)
	if flags&kStep != 0 {
		// The previous name, its trailing number changed: as long, and
		// as valid.
		st, ok := cr.col[cNameLens].next()
		if !ok || prev == nil || !applyStep(cr.name, st) {
			return nil, columnsDrop()
		}
	} else if err := cr.fullName(i); err != nil {
		return nil, err
	}
	l, ok := cr.rowLens(flags)
	if !ok {
		return nil, columnsDrop()
	}
	exits := uint64(0)
	if flags&kExits != 0 {
		if exits, ok = cr.col[cLengths].next(); !ok || exits > uint64(cr.col[cLengths].left/4) {
			return nil, columnsDrop()
		}
		if exits > uint64(cr.lim.MaxExits) {
			return nil, drop(ReasonInconsistent, "key %q: %d exit records, more than %d", cr.name, exits, cr.lim.MaxExits)
		}
	}
	skip, regular := cr.sh.self, flags&kShape == 0
	if !regular {
		skip = -1
	}
	var okRows [6]bool
	k.Row, okRows[0] = cr.row(l[0], skip, regular, &sl.ints)
	k.Taken, okRows[1] = cr.row(l[1], skip, regular, &sl.ints)
	k.In, okRows[2] = cr.row(l[2], skip, regular, &sl.ints)
	k.InTaken, okRows[3] = cr.row(l[3], skip, regular, &sl.ints)
	k.Tokens, okRows[4] = cr.row(l[4], skip, regular, &sl.ints)
	k.Settled, okRows[5] = cr.settled(l[5], skip, regular)
	if okRows != [6]bool{true, true, true, true, true, true} {
		return nil, columnsDrop()
	}
	var sc [6]uint64
	for j, f := range [6]uint64{kGeneration, kBase, kShare, kDemand, kGranted, kTokensWindow} {
		if sc[j], ok = cr.scalar(flags, f); !ok {
			return nil, columnsDrop()
		}
	}
	var pg uint64
	var pb, pw int64
	if prev != nil {
		pg, pb, pw = prev.Generation, prev.Base, prev.TokensWindow
	}
	k.Generation = pg + uint64(protowire.DecodeZigZag(sc[0]))
	k.Base = pb + protowire.DecodeZigZag(sc[1])
	k.Demand = int64(sc[3])
	k.Granted = k.Demand - protowire.DecodeZigZag(sc[4])
	k.TokensWindow = pw + protowire.DecodeZigZag(sc[5])
	if exits > 0 {
		k.Exits = make([]region.Exit, exits)
		for j := range k.Exits {
			if err := cr.exit(&k.Exits[j], k.Generation, sl); err != nil {
				return nil, err
			}
		}
	}
	k.SharePPM = sharePrediction(k, cr.sh) + protowire.DecodeZigZag(sc[2])
	return cr.name, nil
}

// exit reads one exit record of a key of generation gen.
func (cr *colReader) exit(x *region.Exit, gen uint64, sl *slabs) error {
	g, ok := cr.col[cScalars].next()
	if !ok {
		return columnsDrop()
	}
	x.Generation = gen + uint64(protowire.DecodeZigZag(g))
	var l [4]int
	for j := range l {
		v, ok := cr.col[cLengths].next()
		if !ok || v > uint64(cr.col[cValues].left) {
			return columnsDrop()
		}
		l[j] = int(v)
	}
	var okRows [4]bool
	x.Row, okRows[0] = cr.ints(l[0], -1, &sl.ints)
	x.Taken, okRows[1] = cr.ints(l[1], -1, &sl.ints)
	x.In, okRows[2] = cr.ints(l[2], -1, &sl.ints)
	x.InTaken, okRows[3] = cr.ints(l[3], -1, &sl.ints)
	if okRows != [4]bool{true, true, true, true} {
		return columnsDrop()
	}
	return nil
}

// slabSize is the int64 entries of a part's rows, at most: every value
// written, and the entries the wire leaves out of regular rows (the
// sender's own, or in a sparse part those not written: n a row at most,
// each row writing one value at least).
func (cr *colReader) slabSize(body []byte, keys, values int) int {
	if cr.sh.self < 0 && !cr.sh.sparse {
		return values
	}
	rows := 0
	flags := newColumn(body, fColFlags, keys)
	for range keys {
		w, _ := flags.next()
		if f := flagsOfWire(w, cr.sh); f&kShape == 0 {
			rows += bits.OnesCount64(f & (kRow | kIn | kTaken | kInTaken | kTokens))
		}
	}
	if cr.sh.sparse {
		return values + min(rows, values)*cr.sh.n
	}
	return values + rows
}

// fillColumns decodes the keys of a V2 or V3 body that s describes into p,
// whose header fillPart has filled in (and s made room for s.cols[cFlags]
// keys).
func fillColumns(body []byte, s *partShape, p *Part, v Version) error {
	if len(p.Keys) == 0 {
		if s.cols != [nColumns]int{} || len(s.names) > 0 {
			return columnsDrop()
		}
		return nil
	}
	cr := colReader{names: s.names, sh: shapeOf(&p.Header, v), lim: s.lim}
	for c := range cr.col {
		cr.col[c] = newColumn(body, protowire.Number(fColNameLens+c), s.cols[c])
	}
	sl := slabs{ints: make([]int64, cr.slabSize(body, s.cols[cFlags], s.cols[cValues]))}
	strs := keyStrings{buf: make([]byte, 0, keyChunk)}
	var prev *region.KeyReport
	for i := range p.Keys {
		name, err := cr.key(i, &p.Keys[i], prev, &sl)
		if err != nil {
			return err
		}
		strs.add(p.Keys, i, name)
		prev = &p.Keys[i]
	}
	strs.flush(p.Keys)
	for c := range cr.col {
		if cr.col[c].left != 0 {
			return columnsDrop()
		}
	}
	if len(cr.names) > 0 {
		return columnsDrop()
	}
	return nil
}
