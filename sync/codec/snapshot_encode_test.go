package codec

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// TestEncodeSnapshotMatchesGenerated checks that EncodeSnapshot writes what
// proto.Marshal writes, for random snapshots with every field set (some
// left empty) and for a real State's.
func TestEncodeSnapshotMatchesGenerated(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 8))
	var snaps []region.Snapshot
	for i := 0; i < 50; i++ {
		var s region.Snapshot
		fill(t, rng, reflect.ValueOf(&s).Elem(), "Snapshot")
		s.Partial, s.Removed = false, nil // a store's to apply, not encoded
		for j := range s.Keys {
			k := &s.Keys[j]
			if rng.IntN(3) == 0 {
				k.Row, k.Demand, k.Exits, k.Key = nil, nil, nil, ""
			}
			for x := range k.Exits {
				if rng.IntN(2) == 0 {
					k.Exits[x].Exit, k.Exits[x].At = region.Exit{}, time.Time{}
				}
			}
		}
		if rng.IntN(4) == 0 {
			s.HeardAt[0] = time.Time{}
		}
		snaps = append(snaps, s, region.Snapshot{})
	}
	st, err := region.New(region.Config{Self: "eu", Regions: []string{"ap", "eu", "us"}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	for i := 0; i < 3; i++ {
		now = now.Add(time.Second)
		st.Observe("r/a", 100, 90)
		if err := st.Commit(st.Epoch(now)); err != nil {
			t.Fatal(err)
		}
	}
	snaps = append(snaps, st.Snapshot())
	for i := range snaps {
		got, err := EncodeSnapshot(&snaps[i])
		if err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
		want, err := encodeSnapshotGenerated(&snaps[i])
		if err != nil {
			t.Fatalf("snapshot %d: the generated encoder: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("snapshot %d: got\n%x\nwant (proto.Marshal)\n%x", i, got, want)
		}
	}
	bad := region.Snapshot{Region: "eu", Keys: []region.KeySnapshot{{Key: "\xff"}}}
	if _, err := EncodeSnapshot(&bad); err == nil {
		t.Errorf("a key that is not UTF-8: got no error, want one")
	}
}
