package agent

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// keyMap maps a key's id (rule name, NUL, key) to its state. Reads take no
// lock and write no shared memory, so a hot key read from every core costs
// no cache-line traffic; this is sync.Map's read-mostly design, typed so
// that a lookup with a []byte id does not allocate (m[string(b)] does not
// copy) and sharded so that inserting cold keys rarely contends.
type keyMap struct {
	mix    uint64
	shards [keyShards]keyShard
}

const (
	keyShardBits = 6
	keyShards    = 1 << keyShardBits
)

type keyShard struct {
	read atomic.Pointer[readTable]
	mu   sync.Mutex
	// dirty, when not nil, holds every key of the shard, read's and newer
	// ones; read.amended says so. Readers that miss read look here, under
	// mu, and once they have missed as often as dirty has entries, dirty is
	// promoted to read: copying is amortised over the misses it saves.
	dirty  map[string]*keyState
	misses int
	// peak is the most keys the shard's maps have held since they were
	// last built: Go maps never shrink, so remove rebuilds them once most
	// of those entries are gone (see shrinkLocked).
	peak int
	_    [64]byte
}

type readTable struct {
	m       map[string]*keyState
	amended bool
}

func newKeyMap() *keyMap {
	km := &keyMap{mix: maphash.Comparable(maphash.MakeSeed(), 0)}
	for i := range km.shards {
		km.shards[i].read.Store(&readTable{m: map[string]*keyState{}})
	}
	return km
}

// shard picks id's shard from a cheap mix of its length and its last
// eight bytes (where keys that share a rule differ), seeded per map. The
// shard's Go map hashes the id properly; this only spreads inserts, so it
// need not resist adversarial keys, just avoid a second full hash on every
// lookup.
func (km *keyMap) shard(id []byte) *keyShard {
	h := km.mix ^ uint64(len(id))
	if len(id) >= 8 {
		h ^= binary.LittleEndian.Uint64(id[len(id)-8:])
	} else {
		for _, c := range id {
			h = h<<8 | uint64(c)
		}
	}
	h *= 0x9E3779B97F4A7C15
	return &km.shards[h>>(64-keyShardBits)]
}

// get returns the state of id, or nil. A state found may be evicted when
// no successor exists yet, or be evicted meanwhile; its slots are then
// empty, so the caller's spend fails and the slow path looks again.
//
// An evicted state in read while dirty may hold its successor is looked up
// in dirty: returning it would send a request whose key holds a fresh
// lease to the region, until the shard's next promotion. That timing
// depends on which keys share a shard, and the shards on a random seed, so
// the simulator's runs would also differ from one to the next.
func (km *keyMap) get(id []byte) *keyState {
	sh := km.shard(id)
	t := sh.read.Load()
	if k := t.m[string(id)]; !t.amended || (k != nil && !k.evicted.Load()) {
		return k
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.lookupLocked(id)
}

// lookupLocked finds id when read may be stale for it: read lacks it, or
// holds an evicted state while dirty has its successor.
func (sh *keyShard) lookupLocked(id []byte) *keyState {
	t := sh.read.Load()
	k := t.m[string(id)]
	if (k != nil && !k.isEvicted()) || !t.amended {
		return k
	}
	k = sh.dirty[string(id)]
	sh.misses++
	if sh.misses >= len(sh.dirty) {
		sh.read.Store(&readTable{m: sh.dirty})
		sh.dirty, sh.misses = nil, 0
	}
	return k
}

// getOrCreate returns the live state of id, creating it with mk when there
// is none. mk runs under the shard's lock.
func (km *keyMap) getOrCreate(id []byte, mk func(id string) *keyState) *keyState {
	sh := km.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if k := sh.lookupLocked(id); k != nil && !k.isEvicted() {
		return k
	}
	sh.dirtyLocked()
	k := mk(string(id))
	sh.dirty[k.id] = k
	sh.peak = max(sh.peak, len(sh.dirty))
	t := sh.read.Load()
	if !t.amended {
		sh.read.Store(&readTable{m: t.m, amended: true})
	}
	return k
}

// dirtyLocked makes dirty a full copy of the shard, without evicted keys.
func (sh *keyShard) dirtyLocked() {
	if sh.dirty != nil {
		return
	}
	t := sh.read.Load()
	sh.dirty = make(map[string]*keyState, len(t.m)+1)
	for id, k := range t.m {
		if !k.isEvicted() {
			sh.dirty[id] = k
		}
	}
}

// remove deletes k if it is still the state stored for its id.
func (km *keyMap) remove(k *keyState) {
	sh := km.shard([]byte(k.id))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.dirtyLocked()
	if sh.dirty[k.id] == k {
		delete(sh.dirty, k.id)
	}
	if sh.shrinkLocked() {
		return
	}
	t := sh.read.Load()
	if !t.amended {
		sh.read.Store(&readTable{m: t.m, amended: true})
	}
}

// shrinkMinPeak is the smallest peak worth rebuilding for before the shard
// is empty: a map of a few groups costs less than rebuilding it.
const shrinkMinPeak = 32

// shrinkLocked gives the memory of evicted keys back once the shard holds
// under a quarter of its peak (or nothing): it rebuilds dirty at its size
// and promotes it, so that neither the grown maps nor the evicted states
// that read still points to stay reachable. Each rebuild copies what is
// left, at most a third of the removals since the last one, so the copying
// is amortised over them. It reports whether it rebuilt. Called with mu
// held and dirty not nil.
func (sh *keyShard) shrinkLocked() bool {
	n := len(sh.dirty)
	if n*4 >= sh.peak || (n > 0 && sh.peak < shrinkMinPeak) {
		return false
	}
	m := make(map[string]*keyState, n)
	for id, k := range sh.dirty {
		m[id] = k
	}
	sh.read.Store(&readTable{m: m})
	sh.dirty, sh.misses, sh.peak = nil, 0, n
	return true
}

// len returns the number of keys held.
func (km *keyMap) len() int {
	n := 0
	for i := range km.shards {
		sh := &km.shards[i]
		sh.mu.Lock()
		if sh.dirty != nil {
			n += len(sh.dirty)
		} else {
			n += len(sh.read.Load().m)
		}
		sh.mu.Unlock()
	}
	return n
}

// each calls f for every key held (at least those present throughout).
func (km *keyMap) each(f func(*keyState)) {
	for i := range km.shards {
		sh := &km.shards[i]
		sh.mu.Lock()
		m := sh.dirty
		if m == nil {
			m = sh.read.Load().m
		}
		ks := make([]*keyState, 0, len(m))
		for _, k := range m {
			ks = append(ks, k)
		}
		sh.mu.Unlock()
		for _, k := range ks {
			f(k)
		}
	}
}
