package lease

import "maps"

// Clone returns a deep copy of the store: its buckets, expiries and applied
// shares, with the same clock. The simulator models a Redis failover that
// loses a window of writes by keeping a clone and later restoring it.
//
// Clone locks one shard at a time, so a copy taken while other goroutines
// write is not a single instant's state; take it while the store is quiet.
func (m *MemoryStore) Clone() *MemoryStore {
	c := &MemoryStore{clock: m.clock, seed: m.seed, shards: make([]memShard, len(m.shards))}
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		c.shards[i].buckets = maps.Clone(s.buckets)
		c.shards[i].shares = maps.Clone(s.shares)
		s.mu.Unlock()
	}
	return c
}

// Restore replaces the whole state of m with a deep copy of from's (for
// example an older Clone), as if m's writes since then were lost. Like
// Clone, it is meant for a quiet store.
func (m *MemoryStore) Restore(from *MemoryStore) {
	if from == m {
		return
	}
	snap := from.Clone()
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		clear(s.buckets)
		clear(s.shares)
		s.mu.Unlock()
	}
	// Shard counts and seeds may differ, so entries are placed by m's hash.
	for i := range snap.shards {
		for k, b := range snap.shards[i].buckets {
			s := m.shard(k)
			s.mu.Lock()
			s.buckets[k] = b
			s.mu.Unlock()
		}
		for k, v := range snap.shards[i].shares {
			s := m.shard(k)
			s.mu.Lock()
			s.shares[k] = v
			s.mu.Unlock()
		}
	}
}
