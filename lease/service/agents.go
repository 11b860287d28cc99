package service

import (
	"sync"
	"time"
)

// agentSet counts the distinct agents seen within a window. Agents size
// their emergency fallback bucket from this count, so it errs high: an agent
// is forgotten only once the window has passed since its last call.
type agentSet struct {
	window time.Duration
	max    int

	mu        sync.Mutex
	last      map[string]time.Time
	lastPrune time.Time
}

func newAgentSet(window time.Duration, max int) *agentSet {
	return &agentSet{window: window, max: max, last: make(map[string]time.Time)}
}

func (a *agentSet) saw(id string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.last[id]; !ok && len(a.last) >= a.max {
		a.pruneLocked(now)
		if len(a.last) >= a.max {
			a.evictOldestLocked()
		}
	}
	a.last[id] = now
}

func (a *agentSet) count(now time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	// Pruning walks the map, so do it at most a few times per window.
	if now.Sub(a.lastPrune) >= a.window/4 {
		a.pruneLocked(now)
	}
	// Between prunes the count may include agents that went quiet up to a
	// quarter window ago: it errs high, never low.
	return len(a.last)
}

func (a *agentSet) pruneLocked(now time.Time) {
	a.lastPrune = now
	for id, t := range a.last {
		if now.Sub(t) >= a.window {
			delete(a.last, id)
		}
	}
}

func (a *agentSet) evictOldestLocked() {
	var oldest string
	var ot time.Time
	for id, t := range a.last {
		if oldest == "" || t.Before(ot) {
			oldest, ot = id, t
		}
	}
	delete(a.last, oldest)
}
