package agent

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

func TestKeyMapEvictAndRecreate(t *testing.T) {
	km := newKeyMap()
	mk := func(id []byte) *keyState { return newKeyState(id, 1, 0) }
	ids := make([][]byte, 1000)
	for i := range ids {
		ids[i] = fmt.Appendf(nil, "r\x00k%d", i)
		km.getOrCreate(ids[i], mk)
	}
	if got := km.len(); got != 1000 {
		t.Fatalf("len got %d, want 1000", got)
	}
	for i := 0; i < 20; i++ { // read while nothing changes
		for _, id := range ids {
			if km.get(id) == nil {
				t.Fatalf("get(%q) = nil", id)
			}
		}
	}
	k := km.get(ids[7])
	k.flags.set(flagEvicted, true)
	km.remove(k)
	k2 := km.getOrCreate(ids[7], mk)
	if k2 == k {
		t.Fatal("getOrCreate returned the evicted state")
	}
	if got := km.getOrCreate(ids[7], mk); got != k2 {
		t.Error("a second getOrCreate made yet another state")
	}
	// The table held the evicted state until its successor: get must find
	// its successor, or a request on a key with a fresh lease goes to the
	// region (and when, depends on the shard seed).
	if got := km.get(ids[7]); got != k2 {
		t.Errorf("get after evict and recreate got %p (evicted %p), want the successor %p", got, k, k2)
	}
	if got := km.len(); got != 1000 {
		t.Errorf("len after evict and recreate got %d, want 1000", got)
	}
	n := 0
	km.each(func(*keyState) { n++ })
	if n != 1000 {
		t.Errorf("each visited %d, want 1000", n)
	}
}

func TestAllowAllocatesNothingOnLeasedKey(t *testing.T) {
	km := newKeyMap()
	id := []byte("r\x00tenant=acme")
	k := km.getOrCreate(id, func(id []byte) *keyState { return newKeyState(id, 1, 0) })
	k.slots.install(0, math.MaxInt64, 1<<40)
	allocs := testing.AllocsPerRun(1000, func() {
		if k := km.get(id); k != nil {
			k.slots.spend(1, 1)
		}
	})
	if allocs != 0 {
		t.Errorf("lookup and spend allocate %v per run, want 0", allocs)
	}
}

func TestKeyMapShrinksAfterEviction(t *testing.T) {
	km := newKeyMap()
	mk := func(id []byte) *keyState { return newKeyState(id, 1, 0) }
	ids := make([][]byte, 10_000)
	for i := range ids {
		ids[i] = fmt.Appendf(nil, "r\x00k%d", i)
		km.getOrCreate(ids[i], mk)
	}
	for i, id := range ids {
		if i%100 == 0 {
			continue
		}
		k := km.get(id)
		k.flags.set(flagEvicted, true)
		km.remove(k)
	}
	if got := km.len(); got != 100 {
		t.Fatalf("len got %d, want 100", got)
	}
	for i, id := range ids {
		k := km.get(id)
		if (k != nil && !k.isEvicted()) != (i%100 == 0) {
			t.Fatalf("get(%q) got %v, want held %v", id, k, i%100 == 0)
		}
	}
	// No table keeps the evicted states or the room they took.
	for i := range km.shards {
		sh := &km.shards[i]
		tab := sh.tab.Load()
		if slots := groupSlots * len(tab.groups); sh.live*loadDen < minLoadNum*slots && slots > groupSlots {
			t.Errorf("shard %d: a table of %d slots for %d keys", i, slots, sh.live)
		}
		for g := range tab.groups {
			for j := range tab.groups[g].keys {
				if k := tab.groups[g].keys[j].Load(); k != nil && k.isEvicted() {
					t.Errorf("shard %d: the table keeps evicted %q", i, k.id())
				}
			}
		}
	}
}

// TestKeyMapConcurrentReads reads keys while one writer creates and
// removes others, through the tables' growth, tombstones and rebuilds:
// a key held throughout is always found, and whatever get returns has the
// id asked for.
func TestKeyMapConcurrentReads(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	km := newKeyMap()
	mk := func(id []byte) *keyState { return newKeyState(id, 1, 0) }
	const kept, churned = 500, 3000
	ids := make([][]byte, kept+churned)
	for i := range ids {
		ids[i] = fmt.Appendf(nil, "r\x00k%d", i)
	}
	for _, id := range ids[:kept] {
		km.getOrCreate(id, mk)
	}
	var done atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g+1)))
			for !done.Load() {
				i := rng.IntN(len(ids))
				k := km.get(ids[i])
				switch {
				case k != nil && k.id() != string(ids[i]):
					errs <- fmt.Sprintf("get(%q) returned %q", ids[i], k.id())
					return
				case i < kept && (k == nil || k.isEvicted()):
					errs <- fmt.Sprintf("get(%q), held throughout, got %v", ids[i], k)
					return
				}
			}
		}()
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	held := map[int]*keyState{}
	for range 50_000 {
		// Grow to most of the churned keys, then shrink to few, and again.
		i := kept + rng.IntN(churned)
		if k := held[i]; k != nil {
			k.flags.set(flagEvicted, true)
			km.remove(k)
			delete(held, i)
		} else {
			held[i] = km.getOrCreate(ids[i], mk)
		}
	}
	done.Store(true)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if got, want := km.len(), kept+len(held); got != want {
		t.Errorf("len got %d, want %d", got, want)
	}
	for i, k := range held {
		if got := km.get(ids[i]); got != k {
			t.Errorf("get(%q) got %p, want %p", ids[i], got, k)
		}
	}
}
