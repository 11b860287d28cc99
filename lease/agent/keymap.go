package agent

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
)

// keyMap maps a key's id (rule name, NUL, key) to its state. Reads take no
// lock and write no shared memory, so a hot key read from every core costs
// no cache-line traffic; inserts and removals take their shard's lock, so
// inserting cold keys rarely contends.
//
// Each shard is one open-addressed table of pointers to states, whose ids
// are the keys: a held key costs its table a pointer and a tag byte at
// five to seven eighths load (10 to 15 B), where a Go map costs a string
// header too and a sync.Map-style read and dirty pair holds every key
// twice. A table is grouped by cache line, seven slots and their tags (a byte of
// the id's hash each) per line, so that a lookup mostly reads one line of
// the table and dereferences only the states whose tag matches. Writers
// change a table in place with atomic stores that readers may see in any
// order they like: a reader that misses a key being inserted returns nil,
// as a reader would that came a moment earlier, and the caller's slow path
// looks again under the lock. Only a table too full, or too empty, is
// rebuilt and swapped in whole.
type keyMap struct {
	seed   maphash.Seed
	shards [keyShards]keyShard
}

const (
	keyShardBits = 6
	keyShards    = 1 << keyShardBits
)

type keyShard struct {
	tab atomic.Pointer[keyTable]
	mu  sync.Mutex
	// live is the keys in tab, used its slots not empty (keys and the
	// tombstones of removed ones), under mu.
	live, used int
	_          [cacheLine]byte
}

// keyTable is one shard's open-addressed table: a key's probe sequence
// starts at a group picked by its hash and goes on group by group, until a
// group with an empty slot shows the key absent. A removed key's slot
// becomes a tombstone, which keeps the sequences through it whole, until
// the next rebuild.
type keyTable struct {
	groups []keyGroup
}

// keyGroup is one cache line of a table: seven slots and their tags. A tag
// byte is tagEmpty, tagTomb or tagFull with seven bits of the key's hash;
// the eighth byte is tagTomb for good, so that it never matches nor counts
// as empty.
type keyGroup struct {
	tags atomic.Uint64
	keys [groupSlots]atomic.Pointer[keyState]
}

const (
	groupSlots = 7
	tagEmpty   = 0x00
	tagTomb    = 0x01
	tagFull    = 0x80
	lsbs       = 0x0101010101010101
	// slotMSBs masks the high bit of the tag bytes of the seven slots.
	slotMSBs = 0x0080808080808080
	// sentinel is a new group's tags: seven empty slots, the eighth byte a
	// tombstone.
	sentinel = uint64(tagTomb) << (8 * groupSlots)
)

// A table is rebuilt fillNum / loadDen full, once it is more than
// maxLoadNum / loadDen full (tombstones count) or less than minLoadNum /
// loadDen; so between rebuilds, the inserts or removals number at least a
// quarter of its slots, and a rebuild copies at most five eighths of them:
// copying is amortised over the changes.
const (
	loadDen    = 16
	fillNum    = 10
	maxLoadNum = 14
	minLoadNum = 2
)

func newKeyMap() *keyMap {
	km := &keyMap{seed: maphash.MakeSeed()}
	for i := range km.shards {
		km.shards[i].tab.Store(newKeyTable(0))
	}
	return km
}

// newKeyTable returns an empty table that n keys fill fillNum / loadDen.
func newKeyTable(n int) *keyTable {
	slots := (n*loadDen + fillNum - 1) / fillNum
	t := &keyTable{groups: make([]keyGroup, max((slots+groupSlots-1)/groupSlots, 1))}
	for i := range t.groups {
		t.groups[i].tags.Store(sentinel)
	}
	return t
}

// shardOf returns the shard of a key whose hash is h: its top bits. The
// table uses the others.
func (km *keyMap) shardOf(h uint64) *keyShard { return &km.shards[h>>(64-keyShardBits)] }

// first returns the group where the probe sequence of hash h starts.
func (t *keyTable) first(h uint64) int {
	g, _ := bits.Mul64(h<<keyShardBits, uint64(len(t.groups)))
	return int(g)
}

func tagOf(h uint64) uint64 { return tagFull | h&0x7f }

// matches has the high bit of every tag byte of w equal to tag set (and
// now and then, of a byte after one: the caller compares the ids anyway).
func matches(w, tag uint64) uint64 {
	x := w ^ tag*lsbs
	return (x - lsbs) &^ x & slotMSBs
}

// hasEmpty reports whether the tags w have an empty slot.
func hasEmpty(w uint64) bool { return (w-lsbs)&^w&slotMSBs != 0 }

// find returns the state of id, whose hash is h, and its slot, or nils. A
// reader may call it without the lock: the slot held that state when it
// was read, and may hold another key's by now.
func (t *keyTable) find(h uint64, id []byte) (*keyState, *atomic.Pointer[keyState]) {
	tag := tagOf(h)
	g := t.first(h)
	for range t.groups {
		grp := &t.groups[g]
		w := grp.tags.Load()
		for m := matches(w, tag); m != 0; m &= m - 1 {
			p := &grp.keys[bits.TrailingZeros64(m)>>3]
			if k := p.Load(); k != nil && k.id() == string(id) {
				return k, p
			}
		}
		if hasEmpty(w) {
			return nil, nil
		}
		if g++; g == len(t.groups) {
			g = 0
		}
	}
	return nil, nil
}

// slotOf returns the slot holding k, whose hash is h, or nil. Called with
// the shard's lock held.
func (t *keyTable) slotOf(h uint64, k *keyState) (*keyGroup, int) {
	g := t.first(h)
	for range t.groups {
		grp := &t.groups[g]
		w := grp.tags.Load()
		for m := matches(w, tagOf(h)); m != 0; m &= m - 1 {
			if i := bits.TrailingZeros64(m) >> 3; grp.keys[i].Load() == k {
				return grp, i
			}
		}
		if hasEmpty(w) {
			return nil, 0
		}
		if g++; g == len(t.groups) {
			g = 0
		}
	}
	return nil, 0
}

// insert puts k, whose hash is h and which t does not hold, in the first
// free slot of its probe sequence, and reports whether that slot was empty
// (rather than a tombstone). The key is stored before its tag, so that a
// reader matching the tag finds it. Called with the shard's lock held, on
// a table with an empty slot.
func (t *keyTable) insert(h uint64, k *keyState) (wasEmpty bool) {
	g := t.first(h)
	for {
		grp := &t.groups[g]
		w := grp.tags.Load()
		for i := range groupSlots {
			if b := w >> (8 * i) & 0xff; b == tagEmpty || b == tagTomb {
				grp.keys[i].Store(k)
				grp.setTag(i, tagOf(h))
				return b == tagEmpty
			}
		}
		if g++; g == len(t.groups) {
			g = 0
		}
	}
}

// setTag sets slot i's tag to tag. Called with the shard's lock held.
func (grp *keyGroup) setTag(i int, tag uint64) {
	shift := 8 * uint(i)
	grp.tags.Store(grp.tags.Load()&^(0xff<<shift) | tag<<shift)
}

// get returns the state of id, or nil. A state found may be evicted when
// no successor exists yet, or be evicted meanwhile; its slots are then
// empty, so the caller's spend fails and the slow path looks again. A
// successor takes its predecessor's slot, so once it exists, get finds it.
func (km *keyMap) get(id []byte) *keyState {
	h := maphash.Bytes(km.seed, id)
	k, _ := km.shardOf(h).tab.Load().find(h, id)
	return k
}

// getOrCreate returns the live state of id, creating it with mk when there
// is none. mk runs under the shard's lock, and copies id, which is the
// caller's.
func (km *keyMap) getOrCreate(id []byte, mk func(id []byte) *keyState) *keyState {
	h := maphash.Bytes(km.seed, id)
	sh := km.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tab.Load()
	if k, p := t.find(h, id); k != nil {
		if !k.isEvicted() {
			return k
		}
		// Not removed yet: its successor takes the slot, and remove will
		// find it no longer there.
		k = mk(id)
		p.Store(k)
		return k
	}
	k := mk(id)
	if (sh.used+1)*loadDen > maxLoadNum*groupSlots*len(t.groups) {
		t = sh.rebuildLocked(km, sh.live+1)
	}
	if t.insert(h, k) {
		sh.used++
	}
	sh.live++
	return k
}

// remove deletes k if it is still the state stored for its id.
func (km *keyMap) remove(k *keyState) {
	h := maphash.String(km.seed, k.id())
	sh := km.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tab.Load()
	grp, i := t.slotOf(h, k)
	if grp == nil {
		return
	}
	grp.setTag(i, tagTomb)
	grp.keys[i].Store(nil)
	sh.live--
	if slots := groupSlots * len(t.groups); sh.live*loadDen < minLoadNum*slots && slots > groupSlots {
		sh.rebuildLocked(km, sh.live)
	}
}

// rebuildLocked swaps in a table with sh's live keys, sized for n, and
// returns it. The old table stays as it was for readers
// still in it. Called with sh.mu held.
func (sh *keyShard) rebuildLocked(km *keyMap, n int) *keyTable {
	old, t := sh.tab.Load(), newKeyTable(n)
	for g := range old.groups {
		for i := range old.groups[g].keys {
			if k := old.groups[g].keys[i].Load(); k != nil {
				t.insert(maphash.String(km.seed, k.id()), k)
			}
		}
	}
	sh.tab.Store(t)
	sh.used = sh.live
	return t
}

// len returns the number of keys held.
func (km *keyMap) len() int {
	n := 0
	for i := range km.shards {
		sh := &km.shards[i]
		sh.mu.Lock()
		n += sh.live
		sh.mu.Unlock()
	}
	return n
}

// each calls f for every key held (at least those present throughout).
func (km *keyMap) each(f func(*keyState)) {
	var ks []*keyState
	for i := range km.shards {
		sh := &km.shards[i]
		sh.mu.Lock()
		ks = ks[:0]
		t := sh.tab.Load()
		for g := range t.groups {
			for j := range t.groups[g].keys {
				if k := t.groups[g].keys[j].Load(); k != nil {
					ks = append(ks, k)
				}
			}
		}
		sh.mu.Unlock()
		for _, k := range ks {
			f(k)
		}
	}
}
