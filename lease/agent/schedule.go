package agent

import "container/heap"

// schedule is a min-heap of keys by due time, guarded by core.smu.
type schedule []*keyState

func (s schedule) Len() int           { return len(s) }
func (s schedule) Less(i, j int) bool { return s[i].due < s[j].due }
func (s schedule) Swap(i, j int) {
	s[i], s[j] = s[j], s[i]
	s[i].heapIdx, s[j].heapIdx = int32(i), int32(j)
}
func (s *schedule) Push(x any) {
	k := x.(*keyState)
	k.heapIdx = int32(len(*s))
	*s = append(*s, k)
}
func (s *schedule) Pop() any {
	old := *s
	k := old[len(old)-1]
	old[len(old)-1] = nil
	*s = old[:len(old)-1]
	k.heapIdx = -1
	return k
}

// scheduleAt sets k's next check to at, replacing any earlier plan.
func (c *core) scheduleAt(k *keyState, at int64) {
	c.smu.Lock()
	k.due = at
	if k.heapIdx >= 0 {
		heap.Fix(&c.sched, int(k.heapIdx))
	} else {
		heap.Push(&c.sched, k)
	}
	c.smu.Unlock()
}

// scheduleBy makes sure k is checked by at, keeping an earlier plan.
func (c *core) scheduleBy(k *keyState, at int64) {
	c.smu.Lock()
	if k.heapIdx < 0 {
		k.due = at
		heap.Push(&c.sched, k)
	} else if at < k.due {
		k.due = at
		heap.Fix(&c.sched, int(k.heapIdx))
	}
	c.smu.Unlock()
}

func (c *core) unschedule(k *keyState) {
	c.smu.Lock()
	if k.heapIdx >= 0 {
		heap.Remove(&c.sched, int(k.heapIdx))
		c.sched.shrink()
	}
	c.smu.Unlock()
}

// shrink gives back the array of a heap that grew far beyond its keys
// (after many keys were evicted), keeping room for twice those left.
func (s *schedule) shrink() {
	if n := len(*s); cap(*s) > 64 && n < cap(*s)/4 {
		*s = append(make(schedule, 0, 2*n), *s...)
	}
}

// popDue appends the keys due at now to dst, removing them from the heap.
func (c *core) popDue(now int64, dst []*keyState) []*keyState {
	c.smu.Lock()
	defer c.smu.Unlock()
	for len(c.sched) > 0 && c.sched[0].due <= now {
		dst = append(dst, heap.Pop(&c.sched).(*keyState))
	}
	c.sched.shrink()
	return dst
}
