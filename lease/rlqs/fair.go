package rlqs

import "sync"

// Fair sums the demand rates of every bucket of one server's streams per
// store key, so that proxies leasing one key size their buckets to their
// part of the region's rate rather than each to the whole: otherwise the
// first to ask each second would take the refill and the others'
// keep-alives would fail. The zero value is empty; safe for concurrent
// use. A server's Cores share one.
type Fair struct {
	mu  sync.Mutex
	sum map[string]float64
}

// set replaces a bucket's contribution old by new for key and returns the
// key's sum.
func (f *Fair) set(key string, old, new float64) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sum == nil {
		f.sum = map[string]float64{}
	}
	s := max(0, f.sum[key]-old+new)
	if s <= 1e-9 {
		delete(f.sum, key)
		return 0
	}
	f.sum[key] = s
	return s
}
