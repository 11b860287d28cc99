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

	kRows  = kRow | kIn | kTaken | kInTaken | kTokens | kSettled
	kKnown = 1<<14 - 1
)

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

// keyCode is what a key is written as, given the previous key of its part
// (nil for the first).
type keyCode struct {
	shared  int
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
// left out.
type shape struct{ n, self int }

func shapeOf(r *region.Report) shape {
	return shape{len(r.Regions), slices.Index(r.Regions, r.Region)}
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
	case sh.regular(len(v), sh.self < 0 || sh.self < len(v) && v[sh.self] == 0):
		return flag, true
	}
	return 0, false
}

// rowSize is the bytes a row takes in values: less the sender's entry, a
// byte, when the row is regular (not in a key of irregular shape).
func rowSize[T int64 | uint64](v []T, sh shape, irregular bool) int {
	n := valuesSize(v)
	if !irregular && len(v) > 0 && sh.self >= 0 {
		n--
	}
	return n
}

func encodeKey(k, prev *region.KeyReport, sh shape) keyCode {
	var c keyCode
	var pg uint64
	var pb, pw int64
	if prev != nil {
		c.shared = shared(prev.Key, k.Key)
		pg, pb, pw = prev.Generation, prev.Base, prev.TokensWindow
	}
	c.scalars = [6]uint64{
		zigzag(int64(k.Generation - pg)), zigzag(k.Base - pb), zigzag(k.SharePPM - predictShare(k)),
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
	suffix := len(k.Key) - c.shared
	s[cNameLens] = protowire.SizeVarint(uint64(c.shared)) + protowire.SizeVarint(uint64(suffix))
	s[cNames] = suffix
	s[cFlags] = protowire.SizeVarint(c.flags)
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

// key writes k, coded as c.
func (w *colWriter) key(k *region.KeyReport, c *keyCode, sh shape) {
	w.varint(cNameLens, uint64(c.shared))
	w.varint(cNameLens, uint64(len(k.Key)-c.shared))
	w.at[cNames] += copy(w.b[w.at[cNames]:], k.Key[c.shared:])
	w.varint(cFlags, c.flags)
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
