package codec

import (
	"fmt"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/region"
	syncv1 "github.com/ration-dev/ration/sync/v1"
)

// Version 2's and 3's key columns as sync.proto describes them, written the
// naive way over the generated code: the reference that the tests and
// FuzzDecodeDifferential compare columns.go and columns_decode.go with.

// refV3Flags are V3's flags in the order of their wire bits (bit i is
// refV3Flags[i]); V2's are the flags' own bits.
var refV3Flags = []uint64{kRow, kIn, kStep, kDemand, kShare, kGeneration, kGranted, kBase,
	kTaken, kInTaken, kTokens, kSettled, kTokensWindow, kShape, kExits}

func refWireFlags(flags uint64, v Version) uint64 {
	if v < V3 {
		return flags
	}
	var w uint64
	for i, f := range refV3Flags {
		if flags&f != 0 {
			w |= 1 << i
		}
	}
	return w
}

func refFlagsOfWire(w uint64, v Version) (uint64, bool) {
	if v < V3 {
		return w, w < 1<<14
	}
	var flags uint64
	for i, f := range refV3Flags {
		if w&(1<<i) != 0 {
			flags |= f
		}
	}
	return flags, w < 1<<len(refV3Flags)
}

// refDigits is the decimal number name ends with (up to 18 digits): its
// digits' count and value.
func refDigits(name string) (int, int64) {
	w := 0
	for w < len(name) && w < 18 && name[len(name)-1-w] >= '0' && name[len(name)-1-w] <= '9' {
		w++
	}
	if w == 0 {
		return 0, 0
	}
	n, err := strconv.ParseInt(name[len(name)-w:], 10, 64)
	if err != nil {
		panic(err)
	}
	return w, n
}

// refStep is V3's step from prev to name: the difference of their trailing
// numbers (d-1 when positive), when that is all that differs.
func refStep(prev, name string) (uint64, bool) {
	w, a := refDigits(prev)
	if w == 0 || len(name) != len(prev) || name[:len(name)-w] != prev[:len(prev)-w] {
		return 0, false
	}
	b, err := strconv.ParseUint(name[len(name)-w:], 10, 64)
	if err != nil || b == uint64(a) {
		return 0, false
	}
	d := int64(b) - a
	if d > 0 {
		d--
	}
	return protowire.EncodeZigZag(d), true
}

// refApplyStep is the name step c makes of prev, or false.
func refApplyStep(prev []byte, c uint64) ([]byte, bool) {
	w, a := refDigits(string(prev))
	if w == 0 {
		return nil, false
	}
	d := protowire.DecodeZigZag(c)
	if d >= 0 {
		if d >= 1_000_000_000_000_000_000 {
			return nil, false
		}
		d++
	}
	b := a + d // |d| ≤ 10^18 here or the check below fails
	if d < -1_000_000_000_000_000_000 || b < 0 || len(strconv.FormatInt(b, 10)) > w {
		return nil, false
	}
	return fmt.Appendf(append([]byte(nil), prev[:len(prev)-w]...), "%0*d", w, b), true
}

// refSparse reports whether a V3 part of n regions from the one at me
// writes its regular rows sparse: when they have 1 to 8 entries besides
// the sender's.
func refSparse(n, me int, v Version) bool {
	m := n
	if me >= 0 {
		m--
	}
	return v >= V3 && m >= 1 && m <= 8
}

// refWritten is a regular row without the sender's entry.
func refWritten(row []int64, me int) []int64 {
	var out []int64
	for j, x := range row {
		if j != me {
			out = append(out, x)
		}
	}
	return out
}

// refSparseRow is the values of a sparse row whose written entries are w:
// the mask of those not zero with the first of them above it, then the
// others.
func refSparseRow(w []int64) []uint64 {
	var mask uint64
	var nonzero []uint64
	for i, x := range w {
		if x != 0 {
			mask |= 1 << i
			nonzero = append(nonzero, uint64(x))
		}
	}
	if len(nonzero) == 0 {
		return []uint64{0}
	}
	return append([]uint64{nonzero[0]<<len(w) | mask}, nonzero[1:]...)
}

// refPrediction is what the share is written relative to, by the sender
// at me among regions.
func refPrediction(k *region.KeyReport, regions, me int, v Version) int64 {
	if v >= V3 && k.Generation == 0 {
		if regions == 0 {
			return 0
		}
		// region.Config's default initial shares: the remainder to the
		// first regions, a ppm each.
		shares := make([]int64, regions)
		left := int64(1_000_000)
		for i := range shares {
			shares[i] = 1_000_000 / int64(regions)
			left -= shares[i]
		}
		for i := 0; left > 0; i, left = i+1, left-1 {
			shares[i]++
		}
		if me < 0 {
			return 1_000_000 / int64(regions)
		}
		return shares[me]
	}
	return refShare(k)
}

// refShare is the share a key's base and rows add up to (sync.proto).
func refShare(k *region.KeyReport) int64 {
	var rows, taken, in, inTaken int64
	for j := range k.Row {
		rows += k.Row[j]
	}
	for j := range k.Taken {
		taken += k.Taken[j]
	}
	for j := range k.In {
		in += k.In[j]
	}
	for j := range k.InTaken {
		inTaken += k.InTaken[j]
	}
	return k.Base - rows + taken + in - inTaken
}

// selfIndex is the index of the sender among the regions, or -1.
func selfIndex(regions []string, self string) int {
	for i, r := range regions {
		if r == self {
			return i
		}
	}
	return -1
}

// columnsToPB appends keys, the keys of one part of a report from self, to
// pb's columns in version v.
func columnsToPB(pb *syncv1.Part, keys []region.KeyReport, regions []string, self string, v Version) {
	n, me := len(regions), selfIndex(regions, self)
	var prev region.KeyReport // the zero key before the first
	for i := range keys {
		k := &keys[i]
		var flags uint64
		if st, ok := refStep(prev.Key, k.Key); ok && i > 0 && v >= V3 {
			flags |= kStep
			pb.KeyNameLens = append(pb.KeyNameLens, st)
		} else {
			common := 0
			for common < len(k.Key) && common < len(prev.Key) && k.Key[common] == prev.Key[common] {
				common++
			}
			pb.KeyNameLens = append(pb.KeyNameLens, uint64(common), uint64(len(k.Key)-common))
			pb.KeyNames = append(pb.KeyNames, k.Key[common:]...)
		}
		scalars := []struct {
			flag uint64
			v    uint64
		}{
			{kGeneration, protowire.EncodeZigZag(int64(k.Generation - prev.Generation))},
			{kBase, protowire.EncodeZigZag(k.Base - prev.Base)},
			{kShare, protowire.EncodeZigZag(k.SharePPM - refPrediction(k, n, me, v))},
			{kDemand, uint64(k.Demand)},
			{kGranted, protowire.EncodeZigZag(k.Demand - k.Granted)},
			{kTokensWindow, protowire.EncodeZigZag(k.TokensWindow - prev.TokensWindow)},
		}
		for _, s := range scalars {
			if s.v != 0 {
				flags |= s.flag
				pb.KeyScalars = append(pb.KeyScalars, s.v)
			}
		}
		lens := []int{len(k.Row), len(k.Taken), len(k.In), len(k.InTaken), len(k.Tokens), len(k.Settled)}
		settled := make([]int64, len(k.Settled))
		for j, v := range k.Settled {
			settled[j] = int64(v)
		}
		rows := [][]int64{k.Row, k.Taken, k.In, k.InTaken, k.Tokens, settled}
		sparse := refSparse(n, me, v)
		regular := true
		for _, row := range rows {
			regular = regular && (len(row) == 0 || len(row) == n && (me < 0 || row[me] == 0))
			if sparse && len(row) > 0 {
				written := refWritten(row, me)
				for _, x := range written {
					if x != 0 {
						// The first nonzero entry goes above the mask.
						regular = regular && uint64(x) < 1<<(64-len(written))
						break
					}
				}
			}
		}
		if regular {
			for j, f := range []uint64{kRow, kTaken, kIn, kInTaken, kTokens, kSettled} {
				if lens[j] > 0 {
					flags |= f
				}
			}
		} else {
			flags |= kShape
			for _, l := range lens {
				pb.KeyLengths = append(pb.KeyLengths, uint64(l))
			}
		}
		for _, row := range rows {
			if regular && sparse && len(row) > 0 {
				pb.KeyValues = append(pb.KeyValues, refSparseRow(refWritten(row, me))...)
				continue
			}
			for j, v := range row {
				if !regular || j != me {
					pb.KeyValues = append(pb.KeyValues, uint64(v))
				}
			}
		}
		if len(k.Exits) > 0 {
			flags |= kExits
			pb.KeyLengths = append(pb.KeyLengths, uint64(len(k.Exits)))
			for _, x := range k.Exits {
				pb.KeyScalars = append(pb.KeyScalars, protowire.EncodeZigZag(int64(x.Generation-k.Generation)))
				for _, row := range [][]int64{x.Row, x.Taken, x.In, x.InTaken} {
					pb.KeyLengths = append(pb.KeyLengths, uint64(len(row)))
					for _, v := range row {
						pb.KeyValues = append(pb.KeyValues, uint64(v))
					}
				}
			}
		}
		pb.KeyFlags = append(pb.KeyFlags, refWireFlags(flags, v))
		prev = *k
	}
}

// encodeReportGeneratedV2 is EncodeReportVersion(…, V2) through
// proto.Marshal: a part takes keys while proto.Size says they fit.
func encodeReportGeneratedV2(r *region.Report, id uint64, maxBytes int) ([][]byte, error) {
	return encodeReportGeneratedColumns(r, id, maxBytes, V2)
}

// encodeReportGeneratedV3 is encodeReportGeneratedV2 in V3.
func encodeReportGeneratedV3(r *region.Report, id uint64, maxBytes int) ([][]byte, error) {
	return encodeReportGeneratedColumns(r, id, maxBytes, V3)
}

func encodeReportGeneratedColumns(r *region.Report, id uint64, maxBytes int, v Version) ([][]byte, error) {
	hdr := &syncv1.Part{
		Region: r.Region, Replica: r.Replica, Epoch: r.Epoch, SentAtUnixNano: unixNano(r.SentAt), Exchange: r.Exchange,
		Regions: r.Regions, Refresh: r.Refresh, RefreshFrom: r.RefreshFrom, RefreshCount: r.RefreshCount, Since: r.Since,
		Prev: r.Prev, Resent: r.Resent, Resend: r.Resend, Policy: r.Policy, Rules: rulesToPB(r.Rules),
		Reads: uint32(Latest), ReportId: id, Part: ^uint32(0), Parts: ^uint32(0), KeysTotal: ^uint32(0),
	}
	budget := maxBytes - envelopeOverhead - proto.Size(hdr)
	if budget <= 0 {
		return nil, fmt.Errorf("%w: a %d-byte message cannot hold the report header", ErrTooLarge, maxBytes)
	}
	size := func(keys []region.KeyReport) int {
		var pb syncv1.Part
		columnsToPB(&pb, keys, r.Regions, r.Region, v)
		return proto.Size(&pb)
	}
	var cuts []int // of each part's keys
	start := 0
	for i := range r.Keys {
		if size(r.Keys[start:i+1]) <= budget {
			continue
		}
		if i > start {
			cuts, start = append(cuts, i), i
		}
		if n := size(r.Keys[i : i+1]); n > budget {
			return nil, fmt.Errorf("%w: key %q needs %d bytes, %d available", ErrTooLarge, r.Keys[i].Key, n, budget)
		}
	}
	cuts = append(cuts, len(r.Keys))
	hdr.Parts, hdr.KeysTotal = uint32(len(cuts)), uint32(len(r.Keys))
	var out [][]byte
	start = 0
	for p, end := range cuts {
		pb := proto.Clone(hdr).(*syncv1.Part)
		pb.Part = uint32(p)
		columnsToPB(pb, r.Keys[start:end], r.Regions, r.Region, v)
		body, err := proto.Marshal(pb)
		if err != nil {
			return nil, fmt.Errorf("codec: encoding part %d: %w", p, err)
		}
		out = append(out, appendEnvelopeVersion(nil, body, v))
		start = end
	}
	return out, nil
}

// columnsFromPB reads pb's key columns of version v, checking them in the
// order fillColumns does.
func columnsFromPB(pb *syncv1.Part, lim Limits, v Version) ([]region.KeyReport, error) {
	bad := func() error { return drop(ReasonCorrupt, "part: key columns do not add up") }
	lens, names, scalars, values, lengths := pb.KeyNameLens, pb.KeyNames, pb.KeyScalars, pb.KeyValues, pb.KeyLengths
	take := func(col *[]uint64) (uint64, bool) {
		if len(*col) == 0 {
			return 0, false
		}
		v := (*col)[0]
		*col = (*col)[1:]
		return v, true
	}
	me := selfIndex(pb.Regions, pb.Region)
	sparse := refSparse(len(pb.Regions), me, v)
	// sparseRow reads a regular row of a sparse part, or fails.
	sparseRow := func() ([]int64, bool) {
		m := len(pb.Regions)
		if me >= 0 {
			m--
		}
		head, ok := take(&values)
		if !ok {
			return nil, false
		}
		mask := head % (1 << m)
		var written []int64
		for i := range m {
			var x uint64
			switch {
			case mask&(1<<i) == 0:
			case mask%(1<<i) == 0: // the first nonzero entry
				if x = head >> m; x == 0 {
					return nil, false
				}
			default:
				if x, ok = take(&values); !ok || x == 0 {
					return nil, false
				}
			}
			written = append(written, int64(x))
		}
		if mask == 0 && head != 0 {
			return nil, false
		}
		var out []int64
		for j := range pb.Regions {
			if j == me {
				out = append(out, 0)
			} else {
				out, written = append(out, written[0]), written[1:]
			}
		}
		return out, true
	}
	row := func(l uint64, skip int) []int64 {
		var out []int64
		for j := range int(l) {
			var v uint64
			if j != skip {
				v, _ = take(&values)
			}
			out = append(out, int64(v))
		}
		return out
	}
	var keys []region.KeyReport
	var prev region.KeyReport
	var name []byte
	for i, w := range pb.KeyFlags {
		flags, ok := refFlagsOfWire(w, v)
		if !ok {
			return nil, bad()
		}
		if flags&kStep != 0 {
			st, ok := take(&lens)
			if !ok || i == 0 {
				return nil, bad()
			}
			if name, ok = refApplyStep(name, st); !ok {
				return nil, bad()
			}
		} else {
			pre, ok1 := take(&lens)
			suf, ok2 := take(&lens)
			if !ok1 || !ok2 || pre > uint64(len(name)) || suf > uint64(len(names)) {
				return nil, bad()
			}
			if pre+suf > uint64(lim.MaxKeyBytes) {
				return nil, drop(ReasonInconsistent, "key %d: %d bytes, more than %d", i, pre+suf, lim.MaxKeyBytes)
			}
			name = append(append([]byte(nil), name[:pre]...), names[:suf]...)
			names = names[suf:]
			if !utf8.Valid(name) {
				return nil, drop(ReasonCorrupt, "key %d is not UTF-8", i)
			}
		}
		k := region.KeyReport{Key: string(name)}
		var l [6]uint64
		if flags&kShape != 0 {
			if flags&(kRow|kTaken|kIn|kInTaken|kTokens|kSettled) != 0 {
				return nil, bad()
			}
			for j := range l {
				v, ok := take(&lengths)
				if !ok || v > uint64(len(values)) {
					return nil, bad()
				}
				l[j] = v
			}
		} else {
			for j, f := range []uint64{kRow, kTaken, kIn, kInTaken, kTokens, kSettled} {
				if flags&f != 0 {
					l[j] = uint64(len(pb.Regions))
				}
			}
		}
		var exits uint64
		if flags&kExits != 0 {
			var ok bool
			if exits, ok = take(&lengths); !ok || exits > uint64(len(lengths)/4) {
				return nil, bad()
			}
			if exits > uint64(lim.MaxExits) {
				return nil, drop(ReasonInconsistent, "key %q: %d exit records, more than %d", name, exits, lim.MaxExits)
			}
		}
		if flags&kShape == 0 && sparse {
			var rows [6][]int64
			for j := range rows {
				if l[j] > 0 {
					var ok bool
					if rows[j], ok = sparseRow(); !ok {
						return nil, bad()
					}
				}
			}
			k.Row, k.Taken, k.In, k.InTaken, k.Tokens = rows[0], rows[1], rows[2], rows[3], rows[4]
			for _, v := range rows[5] {
				k.Settled = append(k.Settled, uint64(v))
			}
		} else {
			skip, need := -1, l[0]+l[1]+l[2]+l[3]+l[4]+l[5]
			if flags&kShape == 0 && me >= 0 {
				skip = me
				for _, n := range l {
					if n > 0 {
						need--
					}
				}
			}
			if need > uint64(len(values)) {
				return nil, bad()
			}
			k.Row, k.Taken, k.In, k.InTaken, k.Tokens = row(l[0], skip), row(l[1], skip), row(l[2], skip), row(l[3], skip), row(l[4], skip)
			for _, v := range row(l[5], skip) {
				k.Settled = append(k.Settled, uint64(v))
			}
		}
		var sc [6]uint64
		for j, f := range []uint64{kGeneration, kBase, kShare, kDemand, kGranted, kTokensWindow} {
			if flags&f != 0 {
				var ok bool
				if sc[j], ok = take(&scalars); !ok {
					return nil, bad()
				}
			}
		}
		k.Generation = prev.Generation + uint64(protowire.DecodeZigZag(sc[0]))
		k.Base = prev.Base + protowire.DecodeZigZag(sc[1])
		k.Demand = int64(sc[3])
		k.Granted = k.Demand - protowire.DecodeZigZag(sc[4])
		k.TokensWindow = prev.TokensWindow + protowire.DecodeZigZag(sc[5])
		for range exits {
			g, ok := take(&scalars)
			if !ok {
				return nil, bad()
			}
			x := region.Exit{Generation: k.Generation + uint64(protowire.DecodeZigZag(g))}
			var xl [4]uint64
			for j := range xl {
				if xl[j], ok = take(&lengths); !ok || xl[j] > uint64(len(values)) {
					return nil, bad()
				}
			}
			if xl[0]+xl[1]+xl[2]+xl[3] > uint64(len(values)) {
				return nil, bad()
			}
			x.Row, x.Taken, x.In, x.InTaken = row(xl[0], -1), row(xl[1], -1), row(xl[2], -1), row(xl[3], -1)
			k.Exits = append(k.Exits, x)
		}
		k.SharePPM = refPrediction(&k, len(pb.Regions), me, v) + protowire.DecodeZigZag(sc[2])
		keys = append(keys, k)
		prev = k
	}
	if len(lens)+len(names)+len(scalars)+len(values)+len(lengths) > 0 {
		return nil, bad()
	}
	return keys, nil
}
