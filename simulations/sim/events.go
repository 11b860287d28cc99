package sim

import (
	"time"

	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/lease/service"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/region"
)

type eventKind uint8

const (
	evExec   eventKind = iota // a call reaches regiond: the store acts
	evDone                    // a call's answer (or its timeout) reaches the agent
	evEpoch                   // a region's exchange epoch starts: tallies published
	evDecide                  // its second phase: moves decided on everyone's tallies
	evReport                  // a report reaches a region over NATS
	evFault                   // a fault starts
	evHeal                    // a partition ends, or crashed agents come back
	evClone                   // the store state a failover will fall back to
	evDry                     // a regiond's notice of a dry key reaches an agent (WatchDry)
	evProxy                   // an RLQS proxy's or stream's event (rlqs.go)
)

// event is one scheduled happening. Ties in time are broken by seq, the
// order events were scheduled in, so a run never depends on heap order.
type event struct {
	at   int64
	seq  uint64
	kind eventKind

	ag      *agentSim
	call    *agent.Call
	resp    *leasev1.LeaseResponse
	err     error
	replyAt int64 // evExec: when the answer arrives; -1 when it is lost to a timeout

	region int
	from   int
	report *region.Report
	fault  int
	dry    *service.DryKey // evDry
	px     *proxyEvent     // evProxy
}

// eventQueue is a binary min-heap of events by (at, seq).
type eventQueue struct {
	h   []event
	seq uint64
}

func (q *eventQueue) less(i, j int) bool {
	a, b := &q.h[i], &q.h[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (q *eventQueue) push(e event) {
	q.seq++
	e.seq = q.seq
	q.h = append(q.h, e)
	i := len(q.h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

// next reports the time of the earliest event.
func (q *eventQueue) next() (int64, bool) {
	if len(q.h) == 0 {
		return 0, false
	}
	return q.h[0].at, true
}

func (q *eventQueue) pop() event {
	e := q.h[0]
	last := len(q.h) - 1
	q.h[0] = q.h[last]
	q.h[last] = event{}
	q.h = q.h[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(q.h) && q.less(l, m) {
			m = l
		}
		if r < len(q.h) && q.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
	return e
}

// dur converts nanoseconds of simulated time to a Duration.
func dur(ns int64) time.Duration { return time.Duration(ns) }
