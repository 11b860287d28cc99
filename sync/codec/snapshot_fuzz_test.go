package codec

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/ration-dev/ration/region"
)

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
	f.Add(head, legacyRecords(&s)[0])
	f.Add(head, []byte{})
	f.Fuzz(func(t *testing.T, head, rec []byte) {
		for _, h := range [][]byte{head, appendEnvelope(nil, head)} {
			snap, err := JoinSnapshot(h, []string{"k"}, [][]byte{rec})
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

// FuzzSnapshotRecord feeds arbitrary compact records to JoinSnapshot under
// a head of three regions. What it accepts must encode again to a record
// that joins to the same key (its demands quantised), and restore or be
// refused without a panic; what it refuses is a drop with a reason.
func FuzzSnapshotRecord(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 2))
	regions := []string{"ap", "eu", "us"}
	headSnap := region.Snapshot{Region: "eu", Regions: regions, Heard: make([]uint64, 3), HeardAt: make([]time.Time, 3)}
	head, _, err := EncodeSnapshotParts(&headSnap)
	if err != nil {
		f.Fatal(err)
	}
	for range 20 {
		s := randomSnapshot(rng)
		if len(s.Regions) != 3 {
			continue
		}
		_, recs, err := EncodeSnapshotParts(&s)
		if err != nil {
			f.Fatal(err)
		}
		for _, r := range recs {
			f.Add(r)
		}
	}
	f.Add([]byte{recordCompact, 3, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, rec []byte) {
		snap, err := JoinSnapshot(head, []string{"k"}, [][]byte{rec})
		if err != nil {
			if _, ok := ReasonOf(err); !ok {
				t.Fatalf("an unclassified error %v", err)
			}
			return
		}
		if len(snap.Keys) != 1 {
			t.Fatalf("%d keys from one record", len(snap.Keys))
		}
		if rec[0] == recordCompact {
			_, again, err := EncodeSnapshotParts(&snap)
			if err != nil {
				t.Fatalf("a joined key does not encode again: %v", err)
			}
			back, err := JoinSnapshot(head, []string{"k"}, again)
			if err != nil {
				t.Fatalf("encoded again as %x: %v", again[0], err)
			}
			if diff := cmp.Diff(quantised(snap), back, cmpopts.EquateNaNs()); diff != "" {
				t.Fatalf("encoded again and joined (-want +got):\n%s", diff)
			}
		}
		st, err := region.New(region.Config{Self: "eu", Regions: regions})
		if err != nil {
			t.Fatal(err)
		}
		_ = st.Restore(snap) // an error is fine; a panic is not
	})
}
