package codec

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/region"
)

// This file holds the compact record of one key of a persisted snapshot
// (EncodeSnapshotParts): a store keeps a record a key, under the key's
// name, so a record leaves the name out and everything that is zero.
//
//	0x01                 the compact record's version (a record of releases
//	                     before is the Snapshot's key field: 0x3A, field 7)
//	varint m             its columns (regions): the head's
//	varint flags         recFloor, recWindow, recExits, recBase, and a bit
//	                     per row left out (recAbsent<<row)
//	varint Generation
//	[recFloor]  zigzag(Generation − GenerationFloor)
//	[recBase]   zigzag(Base)
//	[recWindow] zigzag(TokensWindow)
//	cells                the rows' values other than zero (below)
//	demand codes         m of them unless Demand is left out (demandCode)
//	[recExits] varint count, then each: zigzag(Generation − exit's),
//	           zigzag(At in ns), varint of the rows left out, cells
//
// Cells are a count, then for each value other than zero its index in the
// rows (row·m + column) less the previous index less one, and the value as
// a zigzag varint. Ack and AckTaken are stored as what Row and Taken exceed
// them by (0 once acknowledged), Settled as Generation less it; differences
// wrap, so every value round-trips.
//
// The smoothed demands are quantised to 13 bits of mantissa (3 bytes
// each): see demandCode.

const (
	recordCompact = 0x01
	recordLegacy  = 7<<3 | byte(protowire.BytesType) // a Snapshot's key field
)

// The flags of a compact record.
const (
	recFloor = 1 << iota
	recWindow
	recExits
	recBase
	recAbsent // recAbsent<<r: row r left out
)

// The rows of a key's cells, in order, and Demand (absent bit only).
const (
	rowRow = iota
	rowTaken
	rowIn
	rowInTaken
	rowRefund
	rowUnclaim
	rowAck
	rowAckTaken
	rowTokens
	rowTokensIn
	rowTokensInWindow
	rowSettled
	keyRows
	rowDemand = keyRows
)

// exitRows is the number of rows of an exit record's cells: Row, Taken, In,
// InTaken, Refund, Ack, Dropped.
const exitRows = 7

// maxExits bounds a record's exit records, as reports bound a key's.
var maxExits = Limits{}.withDefaults().MaxExits

// keyRowsOf returns k's int64 rows in cell order (Settled apart).
func keyRowsOf(k *region.KeySnapshot) [rowSettled][]int64 {
	return [rowSettled][]int64{k.Row, k.Taken, k.In, k.InTaken, k.Refund, k.Unclaim, k.Ack, k.AckTaken, k.Tokens, k.TokensIn, k.TokensInWindow}
}

func exitRowsOf(x *region.ExitSnapshot) [exitRows][]int64 {
	return [exitRows][]int64{x.Row, x.Taken, x.In, x.InTaken, x.Refund, x.Ack, x.Dropped}
}

// appendRecord appends k's compact record for a snapshot of m regions.
// Every row must have m columns or none.
func appendRecord(b []byte, k *region.KeySnapshot, m int) ([]byte, error) {
	bad := func(what string, n int) error {
		return fmt.Errorf("codec: encoding snapshot: key %q: %s has %d columns, want %d or none", k.Key, what, n, m)
	}
	rows := keyRowsOf(k)
	var flags uint64
	for r, v := range rows {
		switch len(v) {
		case m:
		case 0:
			flags |= recAbsent << r
		default:
			return nil, bad(fmt.Sprintf("row %d", r), len(v))
		}
	}
	for _, v := range []struct{ row, n int }{{rowSettled, len(k.Settled)}, {rowDemand, len(k.Demand)}} {
		switch v.n {
		case m:
		case 0:
			flags |= recAbsent << v.row
		default:
			return nil, bad(fmt.Sprintf("row %d", v.row), v.n)
		}
	}
	if len(k.Exits) > maxExits {
		return nil, fmt.Errorf("codec: encoding snapshot: key %q: %d exit records, more than %d", k.Key, len(k.Exits), maxExits)
	}
	for e := range k.Exits {
		for r, v := range exitRowsOf(&k.Exits[e]) {
			if len(v) != 0 && len(v) != m {
				return nil, bad(fmt.Sprintf("exit %d row %d", e, r), len(v))
			}
		}
	}
	if k.GenerationFloor != 0 {
		flags |= recFloor
	}
	if k.TokensWindow != 0 {
		flags |= recWindow
	}
	if len(k.Exits) > 0 {
		flags |= recExits
	}
	if k.Base != 0 {
		flags |= recBase
	}
	b = append(b, recordCompact)
	b = protowire.AppendVarint(b, uint64(m))
	b = protowire.AppendVarint(b, flags)
	b = protowire.AppendVarint(b, k.Generation)
	if flags&recFloor != 0 {
		b = appendZigzag(b, int64(k.Generation-k.GenerationFloor))
	}
	if flags&recBase != 0 {
		b = appendZigzag(b, k.Base)
	}
	if flags&recWindow != 0 {
		b = appendZigzag(b, k.TokensWindow)
	}
	b = appendKeyCells(b, k, &rows, m)
	for _, d := range k.Demand {
		b = appendDemand(b, d)
	}
	if flags&recExits != 0 {
		b = protowire.AppendVarint(b, uint64(len(k.Exits)))
		for e := range k.Exits {
			x := &k.Exits[e]
			b = appendZigzag(b, int64(k.Generation-x.Generation))
			b = appendZigzag(b, unixNano(x.At))
			xr := exitRowsOf(x)
			var absent uint64
			for r, v := range xr {
				if len(v) == 0 {
					absent |= 1 << r
				}
			}
			b = protowire.AppendVarint(b, absent)
			b = appendCells(b, xr[:], m)
		}
	}
	return b, nil
}

// appendKeyCells appends the cells of a key's rows, Ack, AckTaken and
// Settled as differences.
func appendKeyCells(b []byte, k *region.KeySnapshot, rows *[rowSettled][]int64, m int) []byte {
	var buf [cellsOnStack]int64
	vs := cellBuf(&buf, keyRows*m)
	for r := range keyRows {
		row := vs[r*m : (r+1)*m]
		switch r {
		case rowSettled:
			for c, s := range k.Settled {
				row[c] = int64(settledCell(k.Generation, s))
			}
		case rowAck, rowAckTaken:
			v, of := rows[r], rows[r-rowAck]
			switch {
			case len(v) == 0:
			case len(of) == 0:
				copy(row, v)
			default:
				for c := range row {
					row[c] = of[c] - v[c]
				}
			}
		default:
			copy(row, rows[r])
		}
	}
	return appendValues(b, vs)
}

// settledCell is the cell of a Settled generation s of a key in generation
// g: g+1−s, small for the generations a key settles against, but 0 for 0
// (and g+1 for g+1), so that settledOf inverts it.
func settledCell(g, s uint64) uint64 {
	if s == 0 || s == g+1 {
		return s
	}
	return g + 1 - s
}

// settledOf inverts settledCell.
func settledOf(g, v uint64) uint64 { return settledCell(g, v) }

// appendCells appends the cells of rows of m columns (a row may be empty).
func appendCells(b []byte, rows [][]int64, m int) []byte {
	var buf [cellsOnStack]int64
	vs := cellBuf(&buf, len(rows)*m)
	for r, v := range rows {
		copy(vs[r*m:(r+1)*m], v)
	}
	return appendValues(b, vs)
}

// cellsOnStack is how many cells a record's rows are gathered in without
// allocating: a key's rows at up to 10 regions.
const cellsOnStack = 128

// cellBuf returns n zero cells, from buf when they fit.
func cellBuf(buf *[cellsOnStack]int64, n int) []int64 {
	if n <= len(buf) {
		return buf[:n]
	}
	return make([]int64, n)
}

// appendValues appends the cells of vs: the count of those not zero, then
// each as the gap from the previous one and its value.
func appendValues(b []byte, vs []int64) []byte {
	count := 0
	for _, v := range vs {
		if v != 0 {
			count++
		}
	}
	b = protowire.AppendVarint(b, uint64(count))
	last := -1
	for i, v := range vs {
		if v != 0 {
			b = protowire.AppendVarint(b, uint64(i-last-1))
			b = appendZigzag(b, v)
			last = i
		}
	}
	return b
}

func appendZigzag(b []byte, v int64) []byte {
	return protowire.AppendVarint(b, protowire.EncodeZigZag(v))
}

// Demand codes. A smoothed demand only steers (how share is split), and
// what a region restores is its own estimate of every region's: peers keep
// theirs, and the difference fades as the EWMA follows the tallies all
// regions publish. 13 bits of mantissa (a relative error under 2^-14, 61
// ppm) is below the Poisson noise of any key's demand (its relative
// standard deviation after smoothing is about 0.7/√n at n requests an
// epoch, 61 ppm at n ≈ 1.3·10^8), and takes 3 bytes a value; zero takes
// one, and what the quantiser cannot keep (negative, below 2^-127,
// subnormal, infinite, NaN, −0: none a valid demand but a store's to hand
// back as it was given) is kept whole.
const (
	demandZero  = 0 // 0
	demandExact = 1 // the float64's 8 bytes follow, little-endian
	demandFirst = 2 // codes from here: demandFirst + (exponent+demandBias)<<demandBits | mantissa

	demandBits = 13
	demandBias = 127
)

// demandCode returns the quantised code of d, or demandExact.
func demandCode(d float64) uint64 {
	bits := math.Float64bits(d)
	switch {
	case bits == 0:
		return demandZero
	case !(d > 0) || math.IsInf(d, 0):
		return demandExact
	}
	exp := int(bits >> 52) // d > 0: no sign bit
	if exp == 0 {
		return demandExact // subnormal
	}
	const drop = 52 - demandBits
	mant := (bits&(1<<52-1) + 1<<(drop-1)) >> drop // rounded to nearest
	if mant == 1<<demandBits {
		mant, exp = 0, exp+1
	}
	e := exp - 1023 + demandBias
	if e < 0 || exp > 2046 {
		return demandExact
	}
	return demandFirst + (uint64(e)<<demandBits | mant)
}

// demandValue is the value of a quantised code (≥ demandFirst); ok is
// false for a code no demand makes.
func demandValue(code uint64) (float64, bool) {
	q := code - demandFirst
	exp := q>>demandBits + 1023 - demandBias
	if exp == 0 || exp > 2046 {
		return 0, false
	}
	return math.Float64frombits(exp<<52 | (q&(1<<demandBits-1))<<(52-demandBits)), true
}

// quantiseDemand is what a demand reads back as from a record.
func quantiseDemand(d float64) float64 {
	if c := demandCode(d); c >= demandFirst {
		v, _ := demandValue(c)
		return v
	}
	return d
}

func appendDemand(b []byte, d float64) []byte {
	c := demandCode(d)
	b = protowire.AppendVarint(b, c)
	if c == demandExact {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(d))
	}
	return b
}

// recordReader reads a compact record; the first error sticks.
type recordReader struct {
	b   []byte
	err error
}

func (r *recordReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = drop(ReasonCorrupt, "snapshot record: "+format, args...)
	}
}

func (r *recordReader) varint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := protowire.ConsumeVarint(r.b)
	if n < 0 {
		r.err = parseDrop(n)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *recordReader) zigzag() int64 { return protowire.DecodeZigZag(r.varint()) }

// cells reads cells over n values into dst (n long, zeroed).
func (r *recordReader) cells(dst []int64) {
	count := r.varint()
	if count > uint64(len(dst)) {
		r.fail("%d cells of %d values", count, len(dst))
		return
	}
	i := -1
	for range count {
		gap := r.varint()
		if gap >= uint64(len(dst)-i-1) {
			r.fail("a cell past the %d values", len(dst))
			return
		}
		i += int(gap) + 1
		dst[i] = r.zigzag()
		if r.err != nil {
			return
		}
	}
}

func (r *recordReader) demand() float64 {
	switch c := r.varint(); {
	case r.err != nil:
		return 0
	case c == demandZero:
		return 0
	case c == demandExact:
		if len(r.b) < 8 {
			r.err = drop(ReasonTruncated, "snapshot record: a demand cut short")
			return 0
		}
		v := math.Float64frombits(binary.LittleEndian.Uint64(r.b))
		r.b = r.b[8:]
		return v
	default:
		v, ok := demandValue(c)
		if !ok {
			r.fail("demand code %d", c)
		}
		return v
	}
}

// recordSlab holds the allocations a snapshot's decoded rows are carved
// from: a few for a million keys, not a dozen a key.
type recordSlab struct {
	ints   []int64
	floats []float64
	gens   []uint64
	keys   int // the records it is for, which bound an allocation
}

const slabSize = 16 << 10

// size is how much to allocate for n values: enough for every record's n
// up to slabSize.
func (s *recordSlab) size(n int) int { return max(n, min(slabSize, n*s.keys)) }

func (s *recordSlab) int64s(n int) []int64     { return takeN(&s.ints, n, s.size(n)) }
func (s *recordSlab) float64s(n int) []float64 { return takeN(&s.floats, n, s.size(n)) }
func (s *recordSlab) uint64s(n int) []uint64   { return takeN(&s.gens, n, s.size(n)) }

// takeN takes the next n values of *buf (zeroed, length n), first
// allocating size of them when fewer are left; the slice it returns has no
// room to grow into the rest. (fill.go's carve hands out empty slices of a
// counted slab instead.)
func takeN[T any](buf *[]T, n, size int) []T {
	if len(*buf) < n {
		*buf = make([]T, size)
	}
	v := (*buf)[:n:n]
	*buf = (*buf)[n:]
	return v
}

// decodeRecord decodes into k the compact record rec of key for a snapshot
// of m regions, its rows carved from slab.
func decodeRecord(k *region.KeySnapshot, key string, rec []byte, m int, slab *recordSlab) error {
	*k = region.KeySnapshot{Key: key}
	r := recordReader{b: rec[1:]} // rec[0] is recordCompact
	if got := r.varint(); r.err == nil && got != uint64(m) {
		r.fail("%d columns, the head's regions %d", got, m)
	}
	flags := r.varint()
	k.Generation = r.varint()
	if r.err != nil {
		return r.err
	}
	if flags >= recAbsent<<(keyRows+1) {
		r.fail("flags %#x", flags)
	}
	if flags&recFloor != 0 {
		k.GenerationFloor = k.Generation - uint64(r.zigzag())
	}
	if flags&recBase != 0 {
		k.Base = r.zigzag()
	}
	if flags&recWindow != 0 {
		k.TokensWindow = r.zigzag()
	}
	cells := slab.int64s(keyRows * m)
	r.cells(cells)
	if r.err != nil {
		return r.err
	}
	present := func(row int) bool { return flags&(recAbsent<<row) == 0 }
	for row := range keyRows {
		if !present(row) {
			if slices.ContainsFunc(cells[row*m:(row+1)*m], func(v int64) bool { return v != 0 }) {
				r.fail("a value in row %d, which is left out", row)
				return r.err
			}
			continue
		}
		v := cells[row*m : (row+1)*m : (row+1)*m]
		switch row {
		case rowSettled:
			k.Settled = slab.uint64s(m)
			for c := range v {
				k.Settled[c] = settledOf(k.Generation, uint64(v[c]))
			}
			continue
		case rowAck, rowAckTaken:
			if of := row - rowAck; present(of) {
				for c := range v {
					v[c] = cells[of*m+c] - v[c]
				}
			}
		}
		setKeyRow(k, row, v)
	}
	if present(rowDemand) {
		k.Demand = slab.float64s(m)
		for c := range k.Demand {
			k.Demand[c] = r.demand()
		}
	}
	if flags&recExits != 0 {
		r.exits(k, m, slab)
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d bytes after the record", len(r.b))
	}
	return r.err
}

// setKeyRow sets k's int64 row of cell order row.
func setKeyRow(k *region.KeySnapshot, row int, v []int64) {
	*[rowSettled]*[]int64{&k.Row, &k.Taken, &k.In, &k.InTaken, &k.Refund, &k.Unclaim, &k.Ack, &k.AckTaken, &k.Tokens, &k.TokensIn, &k.TokensInWindow}[row] = v
}

// exits reads a record's exit records into k.
func (r *recordReader) exits(k *region.KeySnapshot, m int, slab *recordSlab) {
	n := r.varint()
	if r.err == nil && (n == 0 || n > uint64(maxExits)) {
		r.fail("%d exit records, want 1 to %d", n, maxExits)
	}
	if r.err != nil {
		return
	}
	k.Exits = make([]region.ExitSnapshot, n)
	for e := range k.Exits {
		x := &k.Exits[e]
		x.Generation = k.Generation - uint64(r.zigzag())
		x.At = fromUnixNano(r.zigzag())
		absent := r.varint()
		if r.err == nil && absent >= 1<<exitRows {
			r.fail("exit rows %#x", absent)
		}
		cells := slab.int64s(exitRows * m)
		r.cells(cells)
		if r.err != nil {
			return
		}
		rows := [exitRows]*[]int64{&x.Row, &x.Taken, &x.In, &x.InTaken, &x.Refund, &x.Ack, &x.Dropped}
		for row, p := range rows {
			if absent&(1<<row) == 0 {
				*p = cells[row*m : (row+1)*m : (row+1)*m]
			}
		}
	}
}
