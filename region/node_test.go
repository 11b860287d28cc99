package region_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// orderWorld is a fault-free deployment of Nodes whose effects check the
// protocol's order as they are carried out. A report is delivered the
// moment it is published, so a gift announced before the giver lowered its
// share would be raised at the receiver while the giver still applies it.
type orderWorld struct {
	t       *testing.T
	regions []string
	nodes   []*region.Node
	stores  []map[string]int64
	saved   []*region.Snapshot
	now     time.Time
	writes  int
	checked int
}

type orderFx struct {
	w *orderWorld
	i int
}

func (fx orderFx) WriteShares(_ context.Context, cs []region.ShareChange) []region.ShareChange {
	w := fx.w
	for _, c := range cs {
		w.stores[fx.i][c.Key] = c.SharePPM
		w.writes++
		// Σ over regions of the shares the buckets apply never exceeds one
		// whole share: no region applies share it gave away, nor share
		// given to it before its giver stopped applying it.
		if sum := w.sum(c.Key); sum > region.PPM {
			w.t.Fatalf("%s wrote %s=%d: the regions' shares sum to %d, above %d (shares %v)",
				w.regions[fx.i], c.Key, c.SharePPM, sum, region.PPM, w.shares(c.Key))
		}
	}
	return cs
}

func (fx orderFx) DeleteShares(_ context.Context, keys []string) {
	for _, k := range keys {
		delete(fx.w.stores[fx.i], k)
	}
}

func (fx orderFx) Incarnation(context.Context) (string, error) { return "one", nil }

func (fx orderFx) Persist(_ context.Context, snap *region.Snapshot) error {
	fx.w.saved[fx.i] = region.MergeSnapshot(fx.w.saved[fx.i], snap)
	return nil
}

func (fx orderFx) Load(context.Context) (*region.Snapshot, error) { return fx.w.saved[fx.i], nil }

func (fx orderFx) Publish(ctx context.Context, rep *region.Report) {
	w := fx.w
	if rep.Exchange {
		w.checkAnnounced(fx.i, rep)
	}
	for j, n := range w.nodes {
		if j != fx.i {
			// A duplicate is routine on an at-least-once transport.
			if err := n.Receive(ctx, w.now, rep); err != nil && !errors.Is(err, region.ErrStale) {
				w.t.Fatalf("%s receives from %s: %v", w.regions[j], rep.Region, err)
			}
		}
	}
}

// checkAnnounced checks an exchange report as it is published: the state it
// announces is persisted (a successor never forgets a gift a peer may see),
// and for every key the giver's store is already at or below the share the
// report announces (it lowered before it gave).
func (w *orderWorld) checkAnnounced(i int, rep *region.Report) {
	snap := w.saved[i]
	if snap == nil || snap.Epoch != rep.Epoch {
		w.t.Fatalf("%s publishes epoch %d before persisting it (persisted: %v)", w.regions[i], rep.Epoch, snapEpoch(snap))
	}
	rows := map[string][]int64{}
	for _, k := range snap.Keys {
		rows[k.Key] = k.Row
	}
	for _, k := range rep.Keys {
		if k.Generation == 0 {
			continue
		}
		if got := rows[k.Key]; fmt.Sprint(got) != fmt.Sprint(k.Row) {
			w.t.Fatalf("%s publishes %s's gifts %v, persisted %v", w.regions[i], k.Key, k.Row, got)
		}
		if v := w.applied(i, k.Key); v > k.SharePPM {
			w.t.Fatalf("%s publishes %s at share %d while its store still applies %d", w.regions[i], k.Key, k.SharePPM, v)
		}
		w.checked++
	}
}

func snapEpoch(s *region.Snapshot) any {
	if s == nil {
		return "none"
	}
	return s.Epoch
}

func (w *orderWorld) applied(i int, key string) int64 {
	if v, ok := w.stores[i][key]; ok {
		return v
	}
	return w.nodes[i].Initial(w.regions[i])
}

func (w *orderWorld) sum(key string) (s int64) {
	for i := range w.nodes {
		s += w.applied(i, key)
	}
	return s
}

func (w *orderWorld) shares(key string) (out []int64) {
	for i := range w.nodes {
		out = append(out, w.applied(i, key))
	}
	return out
}

// TestNodeOrder drives three Nodes through demand that moves between the
// regions every few epochs, so that every epoch gives share away somewhere,
// and checks at each effect that the Node carries them out in the order the
// protocol needs: a gift is published only after the giver's share is
// lowered in its store and the state announcing it is persisted, so that a
// receiver never raises a share before its giver stopped applying it.
func TestNodeOrder(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	w := &orderWorld{t: t, regions: []string{"a", "b", "c"}, now: time.Unix(1_700_000_000, 0)}
	keys := []string{"k/1", "k/2", "k/3"}
	for i, name := range w.regions {
		cfg := region.Config{Self: name, Regions: w.regions,
			Policy: func(string) region.KeyPolicy { return region.KeyPolicy{Rate: testRate} }}
		n, err := region.NewNode(cfg, orderFx{w, i})
		if err != nil {
			t.Fatal(err)
		}
		w.nodes = append(w.nodes, n)
		w.stores = append(w.stores, map[string]int64{})
		w.saved = append(w.saved, nil)
		if ch := n.Hold(ctx, region.HoldTaken); !ch.TookOver {
			t.Fatalf("%s does not take over: %+v", name, ch)
		}
	}
	hot := 0
	for epoch := 0; epoch < 200; epoch++ {
		if epoch%4 == 0 {
			hot = rng.IntN(len(w.regions))
		}
		w.now = w.now.Add(time.Second)
		for i, n := range w.nodes {
			for _, k := range keys {
				d := int64(rng.IntN(50))
				if i == hot {
					d = int64(testRate) + int64(rng.IntN(200))
				}
				n.Observe(k, d, d)
			}
		}
		for _, i := range rng.Perm(len(w.nodes)) {
			w.nodes[i].Tally(ctx, w.now)
		}
		for _, i := range rng.Perm(len(w.nodes)) {
			if d := w.nodes[i].Decide(ctx, w.now.Add(250*time.Millisecond)); d.Err != nil || !d.Ran {
				t.Fatalf("epoch %d: %s decides: %+v", epoch, w.regions[i], d)
			}
		}
	}
	t.Logf("%d share writes, %d announced keys checked", w.writes, w.checked)
	if w.writes < 200 || w.checked < 500 {
		t.Fatalf("only %d writes and %d announced keys: the demand did not move share", w.writes, w.checked)
	}
}
