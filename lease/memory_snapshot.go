package lease

// Clone returns a deep copy of the store: its buckets, expiries and applied
// shares, with the same clock. The simulator models a Redis failover that
// loses a window of writes by keeping a clone and later restoring it.
//
// Clone locks one shard at a time, so a copy taken while other goroutines
// write is not a single instant's state; take it while the store is quiet.
func (m *MemoryStore) Clone() *MemoryStore {
	c := &MemoryStore{clock: m.clock, shareTTLMS: m.shareTTLMS, seed: m.seed, shards: make([]memShard, len(m.shards))}
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		c.shards[i].keys = make(map[string]*memEntry, len(s.keys))
		for k, e := range s.keys {
			cp := *e
			c.shards[i].keys[k] = &cp
		}
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
	defer m.restores.Add(1) // a new incarnation: writes may have been lost
	snap := from.Clone()
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		clear(s.keys)
		s.mu.Unlock()
	}
	// Shard counts and seeds may differ, so entries are placed by m's hash;
	// snap is private, so its entries can be moved rather than copied.
	for i := range snap.shards {
		for k, e := range snap.shards[i].keys {
			s := m.shard(k)
			s.mu.Lock()
			s.keys[k] = e
			s.mu.Unlock()
		}
	}
}
