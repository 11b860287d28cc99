package main

import (
	"encoding/json"
	"fmt"
	"time"
)

// snapshot is the figures of one interval, kept for the summary.
type snapshot struct {
	Regions []regionLine `json:"regions"`
	All     allLine      `json:"all"`
}

func (s *sampler) snapshot() snapshot {
	snap := snapshot{All: s.all}
	for _, t := range s.regions {
		snap.Regions = append(snap.Regions, t.line)
	}
	return snap
}

// summary compares the first interval in which every key was active (or
// the first interval, when the run was shorter than a sweep) with the
// last, so that memory that is flat, or grows, shows.
type summary struct {
	Kind  string    `json:"kind"` // "summary"
	First *snapshot `json:"first"`
	Last  *snapshot `json:"last"`
}

// keep records an interval: the first once the sweep has covered every
// key (replacing an earlier one taken before), and always the last.
func (sum *summary) keep(s *sampler, keys int) {
	snap := s.snapshot()
	full := snap.All.ActiveKeys >= int64(keys)
	if sum.First == nil || (full && sum.First.All.ActiveKeys < int64(keys)) {
		sum.First = &snap
	}
	sum.Last = &snap
}

func (p printer) summary(sum summary) {
	if sum.First == nil {
		return
	}
	if p.json {
		sum.Kind = "summary"
		_ = json.NewEncoder(p.w).Encode(sum)
		return
	}
	f, l := sum.First, sum.Last
	at := func(t float64) time.Duration { return time.Duration(t * float64(time.Second)).Round(time.Second) }
	fmt.Fprintf(p.w, "summary: t=%v (%d active keys) → t=%v (%d active keys)\n", at(f.All.T), f.All.ActiveKeys, at(l.All.T), l.All.ActiveKeys)
	for i := range f.Regions {
		a, b := f.Regions[i], l.Regions[i]
		fmt.Fprintf(p.w, "  %-4s rss %s → %s, heap %s → %s, epoch %.0fms → %.0fms, redis %s → %s (entries %d → %d, %.0f → %.0f B/entry; xrecs %d → %d, %.0f → %.0f B/xrec; %.0f → %.0f B/key)\n",
			a.Region, mb(float64(a.RSS)), mb(float64(b.RSS)), mb(float64(a.HeapInuse)), mb(float64(b.HeapInuse)), a.EpochMS, b.EpochMS,
			mb(float64(a.RedisUsed)), mb(float64(b.RedisUsed)), a.Entries, b.Entries, a.PerEntry, b.PerEntry,
			a.XchgRecords, b.XchgRecords, a.PerXchgRec, b.PerXchgRec, a.RedisPerKey, b.RedisPerKey)
	}
	fmt.Fprintf(p.w, "  agents: %d → %d keys held, heap %s → %s, %.0f → %.0f B/key; redis %.0f → %.0f B/active key in all; nats in %s/s → %s/s, out %s/s → %s/s\n",
		f.All.AgentKeys, l.All.AgentKeys, mb(float64(f.All.AgentHeap)), mb(float64(l.All.AgentHeap)), f.All.AgentPerKey, l.All.AgentPerKey,
		f.All.RedisPerActive, l.All.RedisPerActive, mb(f.All.NATSIn), mb(l.All.NATSIn), mb(f.All.NATSOut), mb(l.All.NATSOut))
}
