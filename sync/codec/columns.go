package codec

import (
	"slices"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/region"
)

// Version 2 writes a part's keys as six columns of the Part (sync.proto,
// fields 22 to 27) instead of a Key message each: no tag per field, no
// length per key. Nothing refers to another message, so a lost part costs
// only its own keys, as in version 1. Within a part:
//
//   - a key's name is the length of the prefix it shares with the previous
//     key's name and the rest (keys of one rule share "<rule>/");
//   - its flags say which fields follow, so that zeros cost nothing;
//   - its generation, base and fixed window are differences from the
//     previous key's (the keys of a region enter their generations
//     together), its share the difference from the share its base and rows
//     add up to, and its granted tokens the difference from its demand;
//   - a row has len(regions) entries unless the key's shape says otherwise,
//     and its entry for the sender itself, always 0 (a region gives nothing
//     to itself), is left out.
//
// A measurement of what each step gave is in docs/DESIGN.md ("Reports are
// deltas").
//
// Version 3 has the same columns, written three ways more:
//
//   - a name of the previous key's length that differs from it only in its
//     trailing decimal number (up to 18 digits, as many as the previous
//     name ends with) is that number's difference from the previous key's
//     (flag kStep): one varint in the lengths of names, nothing in names.
//     Keys named by id ("per-user/user=0001234") take a byte or two instead
//     of the two lengths and the digits that differ;
//   - the share of a key without a generation (a tally-only entry, an
//     empty one) is written as its difference from the sender's initial
//     share (PPM/len(regions), plus one for the first PPM%len(regions)
//     regions) rather than from 0;
//   - a regular row of a part whose rows write 1 to maxSparse entries (up
//     to nine regions) is sparse: the mask of its entries that are not
//     zero, with the first such entry above the mask in the same varint,
//     then the others (sparseHead). A zero costs nothing, and the mask
//     nothing either while the first entry is under 2^(21-m) (a gift of
//     under half the quota among three regions); a row of zeros is one
//     byte. A first entry that does not fit above the mask makes its key
//     irregular (kShape), written whole.
//
// Its flags are numbered so that kStep is in the first byte and kBase,
// rarely set, in the second (wireFlags).

// The flags of a key (column fColFlags): bits 0 to 6 are the fields most
// keys have, so that a key's flags take one byte.
const (
	kRow          = 1 << iota // Row has len(regions) entries in values
	kIn                       // so has In
	kBase                     // a scalar: Base - the previous key's Base
	kDemand                   // a scalar: Demand
	kShare                    // a scalar: SharePPM - predictShare
	kGeneration               // a scalar: Generation - the previous key's
	kGranted                  // a scalar: Demand - Granted
	kTaken                    // Taken has len(regions) entries
	kInTaken                  // so has InTaken
	kTokens                   // so has Tokens
	kSettled                  // so has Settled
	kTokensWindow             // a scalar: TokensWindow - the previous key's
	kShape                    // lengths gives the six rows' lengths
	kExits                    // lengths gives the exits and their rows' lengths
	kStep                     // V3: the name is the previous one's number plus a step

	kRows  = kRow | kIn | kTaken | kInTaken | kTokens | kSettled
	kKnown = 1<<14 - 1 // in V2
	// kKnown3 is kKnown in V3, where the first byte of the flags holds
	// kStep instead of kBase.
	kKnown3 = 1<<15 - 1
)

// wireFlags is flags as a part of shape sh writes them: in V3, kStep (bit
// 14 here) is bit 2, kBase bit 7, and bits 7 to 13 one place higher.
func wireFlags(flags uint64, sh shape) uint64 {
	if !sh.v3 {
		return flags
	}
	const low = kRow | kIn | kDemand | kShare | kGeneration | kGranted
	return flags&low | (flags>>14&1)<<2 | (flags>>2&1)<<7 | (flags>>7&0x7f)<<8
}

// flagsOfWire is the inverse of wireFlags.
func flagsOfWire(w uint64, sh shape) uint64 {
	if !sh.v3 {
		return w
	}
	const low = kRow | kIn | kDemand | kShare | kGeneration | kGranted
	return w&low | (w>>2&1)<<14 | (w>>7&1)<<2 | (w>>8&0x7f)<<7
}

// Scalars are written in this order, then each exit's generation (less the
// key's); values are Row, Taken, In, InTaken, Tokens, Settled, then each
// exit's Row, Taken, In and InTaken.

// The columns, in field order.
const (
	cNameLens = iota
	cNames
	cFlags
	cScalars
	cValues
	cLengths
	nColumns
)

// columns are the bytes of each column of a part.
type columns [nColumns]int

func (c *columns) add(d *columns) {
	for i := range c {
		c[i] += d[i]
	}
}

// size is the size of the column fields (two-byte tags): an empty one is
// left out.
func (c *columns) size() int {
	n := 0
	for _, b := range c {
		if b > 0 {
			n += 2 + protowire.SizeBytes(b)
		}
	}
	return n
}

// zigzag is the zigzag encoding of a difference, wrapping as int64 does.
func zigzag(v int64) uint64 { return protowire.EncodeZigZag(v) }

// predictShare is the share a key's base and rows add up to. It wraps like
// any int64 sum: the wire carries the difference, whatever it is.
func predictShare(k *region.KeyReport) int64 {
	p := k.Base
	for _, v := range k.Row {
		p -= v
	}
	for _, v := range k.Taken {
		p += v
	}
	for _, v := range k.In {
		p += v
	}
	for _, v := range k.InTaken {
		p -= v
	}
	return p
}

// sharePrediction is what a key's share is written as a difference from:
// predictShare, or in V3, for a key without a generation, the sender's
// initial share as region.Config's default makes it: PPM/n, and one ppm
// more for each of the first PPM%n regions.
func sharePrediction(k *region.KeyReport, sh shape) int64 {
	if sh.v3 && k.Generation == 0 {
		if sh.n == 0 {
			return 0
		}
		p, n := int64(region.PPM), int64(sh.n)
		if sh.self >= 0 && int64(sh.self) < p%n {
			return p/n + 1
		}
		return p / n
	}
	return predictShare(k)
}

// maxStepDigits bounds the trailing number of a name that a step changes:
// 10^18 fits an int64.
const maxStepDigits = 18

var pow10 = func() (p [maxStepDigits + 1]uint64) {
	p[0] = 1
	for i := 1; i < len(p); i++ {
		p[i] = p[i-1] * 10
	}
	return p
}()

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// trailingDigits is the number of decimal digits name ends with, up to
// maxStepDigits.
func trailingDigits[S string | []byte](name S) int {
	w := 0
	for w < len(name) && w < maxStepDigits && isDigit(name[len(name)-1-w]) {
		w++
	}
	return w
}

// step is V3's code of name after prev when name is prev with its trailing
// number (trailingDigits(prev) digits) changed by d ≠ 0, written in as many
// digits: d-1 for d > 0 and d otherwise, zigzag encoded.
func step(prev, name string) (uint64, bool) {
	w := trailingDigits(prev)
	if w == 0 || len(name) != len(prev) || prev[:len(prev)-w] != name[:len(name)-w] {
		return 0, false
	}
	var a, b int64
	for i := len(prev) - w; i < len(prev); i++ {
		if !isDigit(name[i]) {
			return 0, false
		}
		a = a*10 + int64(prev[i]-'0')
		b = b*10 + int64(name[i]-'0')
	}
	d := b - a
	switch {
	case d == 0:
		return 0, false
	case d > 0:
		d--
	}
	return zigzag(d), true
}

// applyStep changes the trailing number of name (the previous key's name)
// by the step code c, in place; false if name ends with no digit or the
// number leaves its digits.
func applyStep(name []byte, c uint64) bool {
	w := trailingDigits(name)
	if w == 0 {
		return false
	}
	var a uint64
	for _, ch := range name[len(name)-w:] {
		a = a*10 + uint64(ch-'0')
	}
	d := protowire.DecodeZigZag(c)
	var b uint64
	if d >= 0 {
		up := uint64(d) + 1 // d < 2^63: no wrap
		if up >= pow10[w]-a {
			return false
		}
		b = a + up
	} else {
		down := uint64(-(d + 1)) + 1
		if down > a {
			return false
		}
		b = a - down
	}
	for i := len(name) - 1; i >= len(name)-w; i-- {
		name[i] = byte('0' + b%10)
		b /= 10
	}
	return true
}

// keyCode is what a key is written as, given the previous key of its part
// (nil for the first).
type keyCode struct {
	shared  int
	step    uint64 // with kStep: the name's step from the previous name
	flags   uint64
	scalars [6]uint64 // generation, base, share, demand, granted, window
}

func shared(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// shape is what a part's rows look like: n entries, of which the one at
// self (the sender's own, -1 when the sender is not among its regions) is
// left out, so that a regular row writes m; whether the part is V3, and
// whether its regular rows are sparse.
type shape struct {
	n, self, m int
	v3, sparse bool
}

// maxSparse bounds the entries a sparse row writes: its mask is as many
// bits, and a row of one byte decodes to at most maxSparse+1 entries.
const maxSparse = 8

func shapeOf(r *region.Report, v Version) shape {
	sh := shape{n: len(r.Regions), self: slices.Index(r.Regions, r.Region), v3: v >= V3}
	sh.m = sh.n
	if sh.self >= 0 {
		sh.m--
	}
	sh.sparse = sh.v3 && sh.m >= 1 && sh.m <= maxSparse
	return sh
}

// sparseHead is the first value a sparse row writes, and the index of its
// first nonzero entry (-1: none, and the head is 0): the mask of the
// entries it writes that are not zero (bit i for the i-th, the sender's
// left out), with the first such entry above it. The other nonzero entries
// follow it, in order.
func sparseHead[T int64 | uint64](v []T, sh shape) (uint64, int) {
	var mask uint64
	first, bit := -1, 0
	for j, x := range v {
		if j == sh.self {
			continue
		}
		if x != 0 {
			mask |= 1 << bit
			if first < 0 {
				first = j
			}
		}
		bit++
	}
	if first < 0 {
		return 0, -1
	}
	return uint64(v[first])<<sh.m | mask, first
}

// sparseFits reports whether a regular row's first nonzero entry fits
// above its mask; a row where it does not makes its key irregular (kShape),
// written whole.
func sparseFits[T int64 | uint64](v []T, sh shape) bool {
	for j, x := range v {
		if j != sh.self && x != 0 {
			return uint64(x)>>(64-sh.m) == 0
		}
	}
	return true
}

// regular reports whether a row of length l whose entry at self is zero is
// written as its flag: with n entries less the sender's.
func (sh shape) regular(l int, selfZero bool) bool {
	return l == sh.n && (sh.self < 0 || selfZero)
}

// rowFlag is the flag of a regular row, or 0 when it has no entries; ok is
// false for a row that is neither.
func rowFlag[T int64 | uint64](v []T, sh shape, flag uint64) (uint64, bool) {
	switch {
	case len(v) == 0:
		return 0, true
	case sh.regular(len(v), sh.self < 0 || sh.self < len(v) && v[sh.self] == 0) && (!sh.sparse || sparseFits(v, sh)):
		return flag, true
	}
	return 0, false
}

// rowSize is the bytes a row takes in values: less the sender's entry, a
// byte, when the row is regular (not in a key of irregular shape); its
// head and its nonzero entries after the first when it is also sparse.
func rowSize[T int64 | uint64](v []T, sh shape, irregular bool) int {
	if len(v) == 0 {
		return 0
	}
	if !irregular && sh.sparse {
		head, first := sparseHead(v, sh)
		n := protowire.SizeVarint(head)
		for j := first + 1; first >= 0 && j < len(v); j++ {
			if j != sh.self && v[j] != 0 {
				n += protowire.SizeVarint(uint64(v[j]))
			}
		}
		return n
	}
	n := valuesSize(v)
	if !irregular && sh.self >= 0 {
		n--
	}
	return n
}

func encodeKey(k, prev *region.KeyReport, sh shape) keyCode {
	var c keyCode
	var pg uint64
	var pb, pw int64
	if prev != nil {
		if st, ok := step(prev.Key, k.Key); ok && sh.v3 {
			c.step, c.flags = st, kStep
		} else {
			c.shared = shared(prev.Key, k.Key)
		}
		pg, pb, pw = prev.Generation, prev.Base, prev.TokensWindow
	}
	c.scalars = [6]uint64{
		zigzag(int64(k.Generation - pg)), zigzag(k.Base - pb), zigzag(k.SharePPM - sharePrediction(k, sh)),
		uint64(k.Demand), zigzag(k.Demand - k.Granted), zigzag(k.TokensWindow - pw),
	}
	for i, f := range [6]uint64{kGeneration, kBase, kShare, kDemand, kGranted, kTokensWindow} {
		if c.scalars[i] != 0 {
			c.flags |= f
		}
	}
	f1, ok1 := rowFlag(k.Row, sh, kRow)
	f2, ok2 := rowFlag(k.Taken, sh, kTaken)
	f3, ok3 := rowFlag(k.In, sh, kIn)
	f4, ok4 := rowFlag(k.InTaken, sh, kInTaken)
	f5, ok5 := rowFlag(k.Tokens, sh, kTokens)
	f6, ok6 := rowFlag(k.Settled, sh, kSettled)
	if ok1 && ok2 && ok3 && ok4 && ok5 && ok6 {
		c.flags |= f1 | f2 | f3 | f4 | f5 | f6
	} else {
		c.flags |= kShape
	}
	if len(k.Exits) > 0 {
		c.flags |= kExits
	}
	return c
}

// keyColumns is the bytes k adds to each column after prev (nil for the
// first key of a part).
func keyColumns(k, prev *region.KeyReport, sh shape) (columns, keyCode) {
	c := encodeKey(k, prev, sh)
	var s columns
	if c.flags&kStep != 0 {
		s[cNameLens] = protowire.SizeVarint(c.step)
	} else {
		suffix := len(k.Key) - c.shared
		s[cNameLens] = protowire.SizeVarint(uint64(c.shared)) + protowire.SizeVarint(uint64(suffix))
		s[cNames] = suffix
	}
	s[cFlags] = protowire.SizeVarint(wireFlags(c.flags, sh))
	for _, v := range c.scalars {
		if v != 0 {
			s[cScalars] += protowire.SizeVarint(v)
		}
	}
	irr := c.flags&kShape != 0
	s[cValues] = rowSize(k.Row, sh, irr) + rowSize(k.Taken, sh, irr) + rowSize(k.In, sh, irr) + rowSize(k.InTaken, sh, irr) +
		rowSize(k.Tokens, sh, irr) + rowSize(k.Settled, sh, irr)
	if c.flags&kShape != 0 {
		s[cLengths] = protowire.SizeVarint(uint64(len(k.Row))) + protowire.SizeVarint(uint64(len(k.Taken))) +
			protowire.SizeVarint(uint64(len(k.In))) + protowire.SizeVarint(uint64(len(k.InTaken))) +
			protowire.SizeVarint(uint64(len(k.Tokens))) + protowire.SizeVarint(uint64(len(k.Settled)))
	}
	if len(k.Exits) > 0 {
		s[cLengths] += protowire.SizeVarint(uint64(len(k.Exits)))
		for i := range k.Exits {
			x := &k.Exits[i]
			s[cScalars] += protowire.SizeVarint(zigzag(int64(x.Generation - k.Generation)))
			s[cValues] += valuesSize(x.Row) + valuesSize(x.Taken) + valuesSize(x.In) + valuesSize(x.InTaken)
			s[cLengths] += protowire.SizeVarint(uint64(len(x.Row))) + protowire.SizeVarint(uint64(len(x.Taken))) +
				protowire.SizeVarint(uint64(len(x.In))) + protowire.SizeVarint(uint64(len(x.InTaken)))
		}
	}
	return s, c
}

// colWriter writes the columns of a part in one pass over its keys: each
// column has its own place in the message, known from the sizes.
type colWriter struct {
	b   []byte
	at  [nColumns]int
	end [nColumns]int
}

// beginColumns appends the column fields of sizes c to msg, leaving their
// contents for the writer to fill in.
func beginColumns(msg []byte, c *columns) ([]byte, colWriter) {
	var w colWriter
	for i, size := range c {
		if size == 0 {
			w.at[i], w.end[i] = len(msg), len(msg)
			continue
		}
		msg = protowire.AppendTag(msg, protowire.Number(fColNameLens+i), protowire.BytesType)
		msg = protowire.AppendVarint(msg, uint64(size))
		w.at[i], w.end[i] = len(msg), len(msg)+size
		if cap(msg)-len(msg) >= size { // as EncodeReport sizes it
			msg = msg[:len(msg)+size]
		} else {
			msg = append(msg, make([]byte, size)...)
		}
	}
	w.b = msg
	return msg, w
}

func (w *colWriter) varint(c int, v uint64) {
	w.at[c] = len(protowire.AppendVarint(w.b[:w.at[c]], v))
}

func (w *colWriter) values(c int, v []int64) {
	for _, x := range v {
		w.varint(c, uint64(x))
	}
}

// row writes a row of a key, less the entry at skip (-1: none).
func row[T int64 | uint64](w *colWriter, v []T, skip int) {
	for j, x := range v {
		if j != skip {
			w.varint(cValues, uint64(x))
		}
	}
}

// sparseRow writes a regular row of a sparse part.
func sparseRow[T int64 | uint64](w *colWriter, v []T, sh shape) {
	if len(v) == 0 {
		return
	}
	head, first := sparseHead(v, sh)
	w.varint(cValues, head)
	for j := first + 1; first >= 0 && j < len(v); j++ {
		if j != sh.self && v[j] != 0 {
			w.varint(cValues, uint64(v[j]))
		}
	}
}

// key writes k, coded as c.
func (w *colWriter) key(k *region.KeyReport, c *keyCode, sh shape) {
	if c.flags&kStep != 0 {
		w.varint(cNameLens, c.step)
	} else {
		w.varint(cNameLens, uint64(c.shared))
		w.varint(cNameLens, uint64(len(k.Key)-c.shared))
		w.at[cNames] += copy(w.b[w.at[cNames]:], k.Key[c.shared:])
	}
	w.varint(cFlags, wireFlags(c.flags, sh))
	for _, v := range c.scalars {
		if v != 0 {
			w.varint(cScalars, v)
		}
	}
	if c.flags&kShape != 0 {
		for _, l := range [6]int{len(k.Row), len(k.Taken), len(k.In), len(k.InTaken), len(k.Tokens), len(k.Settled)} {
			w.varint(cLengths, uint64(l))
		}
	}
	if sh.sparse && c.flags&kShape == 0 {
		sparseRow(w, k.Row, sh)
		sparseRow(w, k.Taken, sh)
		sparseRow(w, k.In, sh)
		sparseRow(w, k.InTaken, sh)
		sparseRow(w, k.Tokens, sh)
		sparseRow(w, k.Settled, sh)
	} else {
		skip := sh.self
		if c.flags&kShape != 0 {
			skip = -1
		}
		row(w, k.Row, skip)
		row(w, k.Taken, skip)
		row(w, k.In, skip)
		row(w, k.InTaken, skip)
		row(w, k.Tokens, skip)
		row(w, k.Settled, skip)
	}
	if len(k.Exits) == 0 {
		return
	}
	w.varint(cLengths, uint64(len(k.Exits)))
	for i := range k.Exits {
		x := &k.Exits[i]
		w.varint(cScalars, zigzag(int64(x.Generation-k.Generation)))
		for _, l := range [4]int{len(x.Row), len(x.Taken), len(x.In), len(x.InTaken)} {
			w.varint(cLengths, uint64(l))
		}
		w.values(cValues, x.Row)
		w.values(cValues, x.Taken)
		w.values(cValues, x.In)
		w.values(cValues, x.InTaken)
	}
}

// done reports whether every column was filled exactly.
func (w *colWriter) done() bool { return w.at == w.end }
