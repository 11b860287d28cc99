package codec

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// TestSnapshotParts checks that a snapshot encoded as a head and records
// (EncodeSnapshotParts) and joined again, records in any order, decodes to
// what EncodeSnapshot and DecodeSnapshot give; that a whole snapshot is a
// head without records (the format before records, read on upgrade); and
// that a damaged record is dropped.
func TestSnapshotParts(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 9))
	for i := 0; i < 50; i++ {
		var s region.Snapshot
		fill(t, rng, reflect.ValueOf(&s).Elem(), "Snapshot")
		s.Partial, s.Removed = false, nil
		for j := range s.Keys {
			s.Keys[j].Key = fmt.Sprintf("k%d", j) // one record a key, as a store keeps them
		}
		whole, err := EncodeSnapshot(&s)
		if err != nil {
			t.Fatal(err)
		}
		want, err := DecodeSnapshot(whole)
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
		rng.Shuffle(len(recs), func(a, b int) { recs[a], recs[b] = recs[b], recs[a] })
		got, err := JoinSnapshot(head, recs)
		if err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
		if !reflect.DeepEqual(sortKeys(got), sortKeys(want)) {
			t.Fatalf("snapshot %d: joined\n%+v\nwant\n%+v", i, got, want)
		}
		old, err := JoinSnapshot(whole, nil)
		if err != nil || !reflect.DeepEqual(old, want) {
			t.Fatalf("snapshot %d: a whole snapshot as the head: %v", i, err)
		}
		if len(recs) == 0 {
			continue
		}
		for _, bad := range [][]byte{recs[0][:len(recs[0])-1], append(slices.Clone(recs[0]), 0), {0x08, 0x01}, head} {
			r := append(slices.Clone(recs), bad)
			if _, err := JoinSnapshot(head, r); err == nil {
				t.Fatalf("snapshot %d: a damaged record %x was joined", i, bad)
			} else if _, ok := ReasonOf(err); !ok {
				t.Fatalf("snapshot %d: an unclassified error %v", i, err)
			}
		}
	}
}

func sortKeys(s region.Snapshot) region.Snapshot {
	s.Keys = slices.Clone(s.Keys)
	slices.SortStableFunc(s.Keys, func(a, b region.KeySnapshot) int { return strings.Compare(a.Key, b.Key) })
	return s
}

// FuzzJoinSnapshot feeds arbitrary heads and records to JoinSnapshot, and
// whatever it accepts to a region.State's Restore: nothing may panic, and
// JoinSnapshot's errors are drops with a reason.
func FuzzJoinSnapshot(f *testing.F) {
	s := region.Snapshot{Region: "eu", Regions: []string{"ap", "eu"}, Heard: []uint64{1, 0}, HeardAt: make([]time.Time, 2),
		Keys: []region.KeySnapshot{{Key: "k", Generation: 3, Row: []int64{0, 0}, Settled: []uint64{0, 0}}}}
	head, recs, err := EncodeSnapshotParts(&s)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(head, recs[0])
	f.Add(head, []byte{})
	f.Fuzz(func(t *testing.T, head, rec []byte) {
		for _, h := range [][]byte{head, appendEnvelope(nil, head)} {
			snap, err := JoinSnapshot(h, [][]byte{rec})
			if err != nil {
				if _, ok := ReasonOf(err); !ok {
					t.Fatalf("an unclassified error %v", err)
				}
				continue
			}
			st, err := region.New(region.Config{Self: "eu", Regions: []string{"ap", "eu"}})
			if err != nil {
				t.Fatal(err)
			}
			_ = st.Restore(snap) // an error is fine; a panic is not
		}
	})
}
