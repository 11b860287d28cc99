package codec

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/ration-dev/ration/region"
)

// TestSnapshotParts checks that a snapshot encoded as a head and compact
// records (EncodeSnapshotParts) and joined again, records in any order,
// decodes to the snapshot with its demands quantised (quantiseDemand); that
// records as releases before wrote them join to what DecodeSnapshot gives;
// that a whole snapshot is a head without records (the format before
// records, read on upgrade); and that a damaged record is dropped with a
// reason and nothing returned.
func TestSnapshotParts(t *testing.T) {
	eq := []cmp.Option{cmpopts.EquateNaNs(), cmpopts.EquateEmpty()}
	rng := rand.New(rand.NewPCG(seed(t), 9))
	for i := 0; i < 100; i++ {
		s := randomSnapshot(rng)
		whole, err := EncodeSnapshot(&s)
		if err != nil {
			t.Fatal(err)
		}
		old, err := DecodeSnapshot(whole)
		if err != nil {
			t.Fatal(err)
		}
		head, recs, err := EncodeSnapshotParts(&s)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != len(s.Keys) {
			t.Fatalf("%d records for %d keys", len(recs), len(s.Keys))
		}
		keys := snapshotKeys(&s)
		perm := rng.Perm(len(recs))
		got, err := JoinSnapshot(head, permute(keys, perm), permute(recs, perm))
		if err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
		if diff := cmp.Diff(sortKeys(quantised(s)), sortKeys(got), eq...); diff != "" {
			t.Fatalf("snapshot %d: joined (-want +got):\n%s", i, diff)
		}
		if got, err := JoinSnapshot(whole, nil, nil); err != nil || !cmp.Equal(got, old, eq...) {
			t.Fatalf("snapshot %d: a whole snapshot as the head: %v", i, err)
		}
		legacy := legacyRecords(&s)
		if got, err := JoinSnapshot(head, permute(keys, perm), permute(legacy, perm)); err != nil || !cmp.Equal(sortKeys(got), sortKeys(old), eq...) {
			t.Fatalf("snapshot %d: the records of releases before: %v", i, err)
		}
		if len(recs) == 0 {
			continue
		}
		checkDamaged(t, i, head, keys, recs, legacy)
	}
}

// checkDamaged checks that JoinSnapshot drops a damaged record with a reason.
func checkDamaged(t *testing.T, i int, head []byte, keys []string, recs, legacy [][]byte) {
	t.Helper()
	join := func(what string, keys []string, recs [][]byte) {
		t.Helper()
		if snap, err := JoinSnapshot(head, keys, recs); err == nil {
			t.Fatalf("snapshot %d: %s was joined: %+v", i, what, snap)
		} else if _, ok := ReasonOf(err); !ok {
			t.Fatalf("snapshot %d: %s: an unclassified error %v", i, what, err)
		}
	}
	with := func(r []byte) [][]byte { return append(slices.Clone(recs[1:]), r) }
	rest := append(slices.Clone(keys[1:]), keys[0])
	for n := range len(recs[0]) {
		join(fmt.Sprintf("record %x cut to %d bytes", recs[0], n), rest, with(recs[0][:n]))
	}
	join("a byte after the record", rest, with(append(slices.Clone(recs[0]), 0)))
	join("a record of another version", rest, with(append([]byte{2}, recs[0][1:]...)))
	wrongM := append([]byte{recordCompact, recs[0][1] + 1}, recs[0][2:]...)
	join("a record of another region set", rest, with(wrongM))
	join("a record without its key", keys[1:], recs)
	join("a record of no key", append(slices.Clone(keys[1:]), ""), with(recs[0]))
	if len(keys) > 1 {
		swapped := slices.Clone(keys)
		swapped[0], swapped[1] = swapped[1], swapped[0]
		join("a record of releases before under another key's name", swapped, legacy)
	}
	join("a head as a record", rest, with(head))
}

// randomSnapshot returns a snapshot whose keys' rows have a column for each
// region or none, as EncodeSnapshotParts takes them, with values of every
// size (zero most often), demands of every kind, and exit records.
func randomSnapshot(rng *rand.Rand) region.Snapshot {
	m := rng.IntN(5)
	s := region.Snapshot{Region: "eu", Epoch: rng.Uint64(), GenerationFloor: rng.Uint64N(1 << 40)}
	for r := range m {
		s.Regions = append(s.Regions, fmt.Sprintf("r%d", r))
		s.Heard = append(s.Heard, rng.Uint64N(1<<33))
		s.HeardAt = append(s.HeardAt, time.Unix(0, rng.Int64N(1<<62)))
	}
	gen := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return rng.Uint64()
		}
		return 1_700_000_000 + rng.Uint64N(1000)
	}
	val := func() int64 {
		switch rng.IntN(6) {
		case 0, 1, 2:
			return 0
		case 3:
			return rng.Int64N(2000)
		case 4:
			return int64(rng.Uint64())
		}
		return rng.Int64N(1 << 53)
	}
	row := func() []int64 {
		if rng.IntN(5) == 0 {
			return nil
		}
		v := make([]int64, m)
		for c := range v {
			v[c] = val()
		}
		return v
	}
	for j := range rng.IntN(8) {
		k := region.KeySnapshot{Key: fmt.Sprintf("k%d", j), Generation: gen(), GenerationFloor: gen(), Base: val() - val(), TokensWindow: val()}
		for _, p := range []*[]int64{&k.Row, &k.Taken, &k.In, &k.InTaken, &k.Refund, &k.Unclaim, &k.Ack, &k.AckTaken, &k.Tokens, &k.TokensIn, &k.TokensInWindow} {
			*p = row()
		}
		if len(k.Row) > 0 && len(k.Ack) > 0 && rng.IntN(2) == 0 {
			copy(k.Ack, k.Row) // acknowledged: the common case
		}
		if rng.IntN(5) > 0 {
			k.Settled = make([]uint64, m)
			for c := range k.Settled {
				switch rng.IntN(4) {
				case 0:
					k.Settled[c] = gen()
				case 1:
					k.Settled[c] = k.Generation + 1
				case 2:
					k.Settled[c] = k.Generation - rng.Uint64N(5)
				}
			}
		}
		if rng.IntN(5) > 0 {
			k.Demand = make([]float64, m)
			for c := range k.Demand {
				k.Demand[c] = randomDemand(rng)
			}
		}
		for range rng.IntN(3) {
			x := region.ExitSnapshot{Exit: region.Exit{Generation: gen(), Row: row(), Taken: row(), In: row(), InTaken: row()},
				Refund: row(), Ack: row(), Dropped: row()}
			if rng.IntN(2) == 0 {
				x.At = time.Unix(0, rng.Int64N(1<<62))
			}
			k.Exits = append(k.Exits, x)
		}
		s.Keys = append(s.Keys, k)
	}
	return s
}

// randomDemand returns a smoothed demand, or something a demand cannot be.
func randomDemand(rng *rand.Rand) float64 {
	switch rng.IntN(10) {
	case 0:
		return 0
	case 1:
		return []float64{math.Inf(1), math.NaN(), -1, math.Copysign(0, -1), 5e-324, 1e-300, math.MaxFloat64, 0x1.fffffp+1023}[rng.IntN(8)]
	case 2:
		return float64(rng.IntN(1000))
	}
	return math.Exp(rng.NormFloat64() * 8)
}

// quantised is s as JoinSnapshot returns it from compact records: the
// demands quantised.
func quantised(s region.Snapshot) region.Snapshot {
	s.Keys = slices.Clone(s.Keys)
	for i := range s.Keys {
		k := &s.Keys[i]
		if k.Demand != nil {
			k.Demand = slices.Clone(k.Demand)
			for c, d := range k.Demand {
				k.Demand[c] = quantiseDemand(d)
			}
		}
	}
	return s
}

// legacyRecords are s's records as releases before wrote them: each the
// key's field of the Snapshot message.
func legacyRecords(s *region.Snapshot) [][]byte {
	recs := make([][]byte, len(s.Keys))
	for i := range s.Keys {
		k := &s.Keys[i]
		recs[i] = appendKeySnapshot(append([]byte(nil), recordLegacy), k, keySnapshotSize(k))
	}
	return recs
}

func snapshotKeys(s *region.Snapshot) []string {
	keys := make([]string, len(s.Keys))
	for i := range s.Keys {
		keys[i] = s.Keys[i].Key
	}
	return keys
}

func permute[T any](v []T, perm []int) []T {
	out := make([]T, len(v))
	for i, p := range perm {
		out[i] = v[p]
	}
	return out
}

func sortKeys(s region.Snapshot) region.Snapshot {
	s.Keys = slices.Clone(s.Keys)
	slices.SortStableFunc(s.Keys, func(a, b region.KeySnapshot) int { return strings.Compare(a.Key, b.Key) })
	return s
}

// TestSnapshotRecordSize checks the size of the record of a steady key
// among three regions (lease's encodeExchangeRecords): a generation, the
// base, one gift made, received and acknowledged, and the smoothed demands.
func TestSnapshotRecordSize(t *testing.T) {
	z := func() []int64 { return make([]int64, 3) }
	s := region.Snapshot{Region: "eu", Regions: []string{"ap", "eu", "us"}, Heard: make([]uint64, 3), HeardAt: make([]time.Time, 3),
		Keys: []region.KeySnapshot{{
			Key: "per-user/user=0001234", Generation: 1_700_000_001, Base: 333_333,
			Row: []int64{0, 0, 1420}, Taken: z(), In: []int64{0, 0, 226_933}, InTaken: z(),
			Refund: z(), Unclaim: z(), Ack: []int64{0, 0, 1420}, AckTaken: z(), Settled: make([]uint64, 3),
			Tokens: z(), TokensIn: z(), TokensInWindow: z(), Demand: []float64{118.99999999999999, 159, 1.9967431728041785},
		}}}
	_, recs, err := EncodeSnapshotParts(&s)
	if err != nil {
		t.Fatal(err)
	}
	legacy := legacyRecords(&s)
	t.Logf("a steady key's record: %d B (%d B as releases before wrote it, its name included)", len(recs[0]), len(legacy[0]))
	if len(recs[0]) > 28 {
		t.Errorf("a steady key's record: %d B, want ≤ 28", len(recs[0]))
	}
}

// TestDemandCode checks the quantiser: within 2^-14 of the demand, exact
// for zero and for what it cannot keep, 3 bytes for demands of 2^-127 to
// 2^128.
func TestDemandCode(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 10))
	for range 100_000 {
		d := math.Exp(rng.NormFloat64() * 20)
		q := quantiseDemand(d)
		if math.Abs(q-d) > d*0x1p-14 {
			t.Fatalf("%v quantised to %v: off by %.3g of it", d, q, math.Abs(q-d)/d)
		}
		if n := len(appendDemand(nil, d)); d >= 0x1p-127 && d < 0x1p128 && n > 3 {
			t.Fatalf("%v takes %d bytes, want ≤ 3", d, n)
		}
		if quantiseDemand(q) != q {
			t.Fatalf("%v quantised again to %v", q, quantiseDemand(q))
		}
	}
	for _, d := range []float64{0, math.Inf(1), -1, 1e-300, 5e-324, math.MaxFloat64} {
		if q := quantiseDemand(d); q != d {
			t.Errorf("%v quantised to %v, want it kept", d, q)
		}
	}
	if q := quantiseDemand(math.NaN()); !math.IsNaN(q) {
		t.Errorf("NaN quantised to %v", q)
	}
}
