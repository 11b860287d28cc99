package service

import (
	"cmp"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"time"
	"unsafe"

	boom "github.com/tylertreat/BoomFilters"

	"github.com/ration-dev/ration/policy"
)

// recent is a bounded summary of what agents reported over the last few
// minutes: per key, the tokens admitted and denied (demand less admitted),
// for the admin API's top keys and a key's recent counts. Its memory does
// not grow with the number of keys:
//
//   - time is cut into slots of recentSlot; the summary answers over the
//     current slot and the recentSlots-1 before it;
//   - keys are spread over recentShards shards, each under its own lock, so
//     that concurrent Lease calls rarely meet;
//   - each shard's slot holds two count-min sketches (tylertreat/BoomFilters:
//     admitted and denied tokens, recentWidth × recentDepth counters each),
//     which estimate any key's count from above, by at most ε × the slot's
//     total in the shard with probability 1-δ;
//   - and, per rule (at most recentMaxRules, then otherRule), the
//     Config.TopKeys keys with the highest estimate of denied tokens and of
//     demand: the candidates Top ranks.
//
// BoomFilters' own TopK adds one at a time (a report of 500 tokens would be
// 500 calls) and keeps the caller's byte slice, so the candidates are kept
// here, beside its sketches.
type recent struct {
	k      int // candidates per rule, shard, slot and measure
	seed   maphash.Seed
	start  time.Time // the summary counts from then
	shards [recentShards]recentShard
}

const (
	recentSlot   = time.Minute
	recentSlots  = 6 // the current minute and the five before
	recentShards = 8
	// DefaultTopKeys is Config.TopKeys's default: candidates per rule,
	// shard, slot and measure.
	DefaultTopKeys = 16
	// recentEpsilon and recentDelta size each sketch: ⌈e/ε⌉ = 272 counters
	// wide, ⌈ln 1/δ⌉ = 5 deep, 10.9 kB.
	recentEpsilon  = 0.01
	recentDelta    = 0.01
	recentMaxRules = 1024
	otherRule      = "other"
)

type recentShard struct {
	mu    sync.Mutex
	slots [recentSlots]recentSlotState
	_     [64]byte // keeps neighbouring locks off one cache line
}

// recentSlotState is one shard's counts in one slot.
type recentSlotState struct {
	at               int64 // the slot's number (Unix time / recentSlot); 0 unused
	admitted, denied *boom.CountMinSketch
	rules            map[string]*ruleTop
}

// ruleTop is one rule's candidates in a shard's slot.
type ruleTop struct {
	denied, demand candidates
}

// candidates are at most recent.k keys with their estimates; a key whose
// estimate reaches the smallest takes its place (as BoomFilters' TopK).
type candidates []candidate

type candidate struct {
	key   string
	hash  uint64 // compared before the key
	count uint64
}

func (c *candidates) offer(k int, key string, hash, count uint64) {
	low := -1
	for i := range *c {
		e := &(*c)[i]
		if e.hash == hash && e.key == key {
			e.count = count
			return
		}
		if low < 0 || e.count < (*c)[low].count {
			low = i
		}
	}
	switch {
	case len(*c) < k:
		*c = append(*c, candidate{key, hash, count})
	case count >= (*c)[low].count:
		(*c)[low] = candidate{key, hash, count}
	}
}

// newRecent returns a summary keeping k candidates; nil (none) for k <= 0.
func newRecent(now time.Time, k int) *recent {
	if k <= 0 {
		return nil
	}
	return &recent{k: k, seed: maphash.MakeSeed(), start: now}
}

// bytesOf views s as bytes for the sketches' hash, which only reads them:
// no copy on the lease path.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

func slotOf(now time.Time) int64 { return now.UnixNano() / int64(recentSlot) }

// record counts what an agent reported for a key of rule at now: demand
// tokens asked, admitted of them admitted. A nil summary records nothing.
func (r *recent) record(now time.Time, rule, key string, demand, admitted int64) {
	if r == nil || demand <= 0 {
		return
	}
	admitted = min(max(admitted, 0), demand)
	denied := demand - admitted
	at := slotOf(now)
	h := maphash.String(r.seed, key)
	sh := &r.shards[h%recentShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := &sh.slots[at%recentSlots]
	if s.at != at {
		s.reset(at)
	}
	b := bytesOf(key)
	if admitted > 0 {
		s.admitted.AddN(b, uint64(admitted))
	}
	t := s.rule(rule)
	var dc uint64
	if denied > 0 {
		s.denied.AddN(b, uint64(denied))
		dc = s.denied.Count(b)
		t.denied.offer(r.k, key, h, dc)
	} else {
		dc = s.denied.Count(b)
	}
	t.demand.offer(r.k, key, h, s.admitted.Count(b)+dc)
}

// newSketch is a count-min sketch hashing with maphash, several times
// faster than its default FNV on the lease path.
func newSketch() *boom.CountMinSketch {
	c := boom.NewCountMinSketch(recentEpsilon, recentDelta)
	var h maphash.Hash
	c.SetHash(&h)
	return c
}

// reset starts the slot afresh for slot number at; its sketches are made
// at its first use (a service that leases nothing holds none).
func (s *recentSlotState) reset(at int64) {
	s.at = at
	if s.admitted == nil {
		s.admitted, s.denied = newSketch(), newSketch()
	}
	s.admitted.Reset()
	s.denied.Reset()
	clear(s.rules)
}

// rule returns rule's candidates, under otherRule beyond recentMaxRules.
func (s *recentSlotState) rule(name string) *ruleTop {
	t := s.rules[name]
	if t != nil {
		return t
	}
	if s.rules == nil {
		s.rules = make(map[string]*ruleTop)
	}
	if len(s.rules) >= recentMaxRules {
		name = otherRule
		if t = s.rules[name]; t != nil {
			return t
		}
	}
	t = &ruleTop{}
	s.rules[name] = t
	return t
}

// live reports whether slot s counts at slot now.
func (s *recentSlotState) live(now int64) bool {
	return s.at != 0 && s.at > now-recentSlots && s.at <= now
}

// RecentCounts are a key's recent tokens, as the bounded summary estimates
// them (from above): Admitted and Denied over Window. Tracked is true when
// the key is among the candidates Top ranks; a key that is not may still
// show counts that are the sketches' error rather than its own.
type RecentCounts struct {
	Window           time.Duration
	Admitted, Denied uint64
	Tracked          bool
}

// TopKey is one key of Top: its store key and rule, the measure ranked
// (Count, an estimate that exceeds the truth by at most Error with
// probability 0.99 per key), and its recent counts.
type TopKey struct {
	StoreKey, Rule   string
	Count, Error     uint64
	Admitted, Denied uint64
}

// window is how far back the summary answers at now.
func (r *recent) window(now time.Time) time.Duration {
	from := time.Unix(0, (slotOf(now)-recentSlots+1)*int64(recentSlot))
	if r.start.After(from) {
		from = r.start
	}
	return max(now.Sub(from), 0)
}

// counts returns a key's recent counts at now, and the bound of their
// estimates' error.
func (r *recent) counts(now time.Time, key string) (c RecentCounts, errAdmitted, errDenied uint64) {
	if r == nil {
		return RecentCounts{}, 0, 0
	}
	c.Window = r.window(now)
	at := slotOf(now)
	b := bytesOf(key)
	sh := &r.shards[maphash.String(r.seed, key)%recentShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var totA, totD uint64
	for i := range sh.slots {
		s := &sh.slots[i]
		if !s.live(at) {
			continue
		}
		c.Admitted += s.admitted.Count(b)
		c.Denied += s.denied.Count(b)
		totA += s.admitted.TotalCount()
		totD += s.denied.TotalCount()
		for _, t := range s.rules {
			c.Tracked = c.Tracked || slices.ContainsFunc(t.demand, func(e candidate) bool { return e.key == key })
		}
	}
	return c, uint64(math.Ceil(recentEpsilon * float64(totA))), uint64(math.Ceil(recentEpsilon * float64(totD)))
}

// top returns the n keys of rule ("" every rule) with the most denied
// tokens (byDenied) or demand over the window at now, most first.
func (r *recent) top(now time.Time, rule string, byDenied bool, n int) ([]TopKey, time.Duration) {
	if r == nil || n <= 0 {
		return nil, 0
	}
	at := slotOf(now)
	var out []TopKey
	for i := range r.shards {
		out = r.shards[i].top(at, rule, byDenied, out)
	}
	slices.SortFunc(out, func(a, b TopKey) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.StoreKey, b.StoreKey))
	})
	return out[:min(n, len(out))], r.window(now)
}

// top appends the shard's candidates of rule, with their counts.
func (sh *recentShard) top(at int64, rule string, byDenied bool, out []TopKey) []TopKey {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	seen := make(map[string]string) // key → rule
	for i := range sh.slots {
		s := &sh.slots[i]
		if !s.live(at) {
			continue
		}
		for name, t := range s.rules {
			if rule != "" && name != rule {
				continue
			}
			list := t.demand
			if byDenied {
				list = t.denied
			}
			for _, e := range list {
				seen[e.key] = name
			}
		}
	}
	var totA, totD uint64
	for i := range sh.slots {
		if s := &sh.slots[i]; s.live(at) {
			totA += s.admitted.TotalCount()
			totD += s.denied.TotalCount()
		}
	}
	errD := uint64(math.Ceil(recentEpsilon * float64(totD)))
	errA := uint64(math.Ceil(recentEpsilon * float64(totA)))
	for key, name := range seen {
		k := TopKey{StoreKey: key, Rule: name}
		if r, _, ok := policy.SplitStoreKey(key); ok {
			k.Rule = r // not otherRule
		}
		b := bytesOf(key)
		for i := range sh.slots {
			if s := &sh.slots[i]; s.live(at) {
				k.Admitted += s.admitted.Count(b)
				k.Denied += s.denied.Count(b)
			}
		}
		k.Count, k.Error = k.Denied, errD
		if !byDenied {
			k.Count, k.Error = k.Admitted+k.Denied, errA+errD
		}
		if k.Count > 0 {
			out = append(out, k)
		}
	}
	return out
}
