package agent

import (
	"testing"
	"time"
)

const (
	perHour = "{name: r, key: [tenant], limit: 100, period: 1h}"
	perDay  = "{name: r, key: [tenant], limit: 10000, period: 24h}"
)

// TestSlowQuotaLeases runs quotas of a few tokens an hour under steady
// demand above their rate, a few requests a minute, and bursts: the agents
// admit what one ideal bucket would, and no token expires unspent in a
// lease (a dropped token of a daily quota is gone for the day; it must go
// back to the region instead). Before the agent checked a key before the
// first of its leases expired (rather than the newest), gave back what a
// slow quota would not spend, and sized a lease for the requests waiting
// for it, bursts dropped up to 5% of the day's quota and a burst on a cold
// key got one more token per round trip: 72% of the ideal for 200 requests
// at once.
func TestSlowQuotaLeases(t *testing.T) {
	for _, tt := range []struct {
		name   string
		rule   string
		agents int
		times  []time.Duration
		end    time.Duration
		calls  int64 // at most this many lease calls; 0: unchecked
	}{
		{"100/h, 1 req/s for 2h", perHour, 1, every(0, time.Second, 7200), 2 * time.Hour, 0},
		{"100/h, 1 req/min for 3h", perHour, 1, every(0, time.Minute, 180), 3 * time.Hour, 0},
		{"100/h, 5 req/min for 2h", perHour, 1, every(0, 12*time.Second, 600), 2 * time.Hour, 0},
		{"100/h, 4 agents, 1 req/s for 2h", perHour, 4, every(0, time.Second, 7200), 2 * time.Hour, 0},
		{"100/h, bursts of 30 at once every 10min for 2h", perHour, 1, bursts(0, 10*time.Minute, 0, 30, 12), 2 * time.Hour, 2 * 12},
		{"10000/day, 1 req/s for 6h", perDay, 1, every(0, time.Second, 6*3600), 6 * time.Hour, 0},
		{"10000/day, 3 req/min for 6h", perDay, 1, every(0, 20*time.Second, 6*180), 6 * time.Hour, 0},
		{"10000/day, 10 req/s for 1h", perDay, 1, every(0, 100*time.Millisecond, 36000), time.Hour, 0},
		{"10000/day, 4 agents, bursts of 200 at once every 5min for 6h", perDay, 4, bursts(0, 5*time.Minute, 0, 200, 72), 6 * time.Hour, 2 * 72 * 4},
		{"10000/day, 4 agents, bursts of 200 in 20ms every 5min for 6h", perDay, 4, bursts(0, 5*time.Minute, 100*time.Microsecond, 200, 72), 6 * time.Hour, 0},
		{"10000/day, 4 agents, bursts of 200 in 200ms every 5min for 6h", perDay, 4, bursts(0, 5*time.Minute, time.Millisecond, 200, 72), 6 * time.Hour, 0},
		{"10000/day, bursts of 200 in 200ms every 5min for 6h", perDay, 1, bursts(0, 5*time.Minute, time.Millisecond, 200, 72), 6 * time.Hour, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newQuotaWorld(t, tt.rule, tt.agents, Config{})
			w.run(tt.times, roundRobin(tt.agents), tt.end)
			ideal := idealAdmits(w.rule, tt.times)
			t.Log(w.summary(ideal))
			_, dropped, _, calls, _ := w.stats()
			if w.res.admitted < ideal || w.res.admitted > ideal+int64(tt.agents) {
				t.Errorf("admitted %d, want the ideal bucket's %d (at most one more per agent)", w.res.admitted, ideal)
			}
			if dropped != 0 {
				t.Errorf("%d tokens expired unspent, want every unspent token given back", dropped)
			}
			if tt.calls > 0 && calls > tt.calls {
				t.Errorf("%d lease calls, want at most %d: two per burst and agent", calls, tt.calls)
			}
		})
	}
}

// TestSlowQuotaOutage cuts ten agents off their region and checks what
// their emergency buckets admit: neither nothing (before, a key's bucket
// started empty, its first token took 43 s to 3 min, and it was forgotten
// with its key after 10 s idle, so requests a minute apart were never
// admitted) nor much more than twice the quota's pace.
func TestSlowQuotaOutage(t *testing.T) {
	const agents = 10
	for _, tt := range []struct {
		name     string
		rule     string
		times    []time.Duration
		from, to time.Duration
		least    int64 // admitted during the outage, at least
	}{
		{"1000/s, 500 req/s, 10s", "{name: r, key: [tenant], limit: 1000, period: 1s}", every(0, 2*time.Millisecond, 30000), 20 * time.Second, 30 * time.Second, 5000},
		{"100/h, 1 req/min, 1h", perHour, every(0, time.Minute, 180), time.Hour, 2 * time.Hour, 60},
		{"100/h, 1 req/min, 1min", perHour, every(0, time.Minute, 180), time.Hour, time.Hour + time.Minute + time.Second, 2},
		{"10000/day, 3 req/min, 10min", perDay, every(0, 20*time.Second, 3*180), time.Hour, time.Hour + 10*time.Minute, 30},
		// Demand of 8.6 times the quota's pace: about twice the pace.
		{"10000/day, 1 req/s, 10min", perDay, every(0, time.Second, 3*3600), time.Hour, time.Hour + 10*time.Minute, 130},
		{"10000/day, bursts of 50 every 5min, 30min", perDay, bursts(0, 5*time.Minute, 10*time.Millisecond, 50, 36), time.Hour, time.Hour + 30*time.Minute, 250},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newQuotaWorld(t, tt.rule, agents, Config{})
			w.downFrom, w.downTo = tt.from, tt.to
			w.run(tt.times, roundRobin(agents), tt.times[len(tt.times)-1]+time.Second)
			d := (tt.to - tt.from).Seconds()
			// Each agent's bucket: one cost to start, then twice its share
			// of the rate; leases held at the start add at most one TTL of
			// the rate.
			bound := int64(agents + DefaultFallbackHeadroom*w.rule.Rate()*d + w.rule.Rate()*0.1)
			t.Logf("outage: admitted %d of %d asked, at least %d, at most %d; whole run: %s",
				w.res.outageAdmitted, w.res.outageAsked, tt.least, bound, w.summary(idealAdmits(w.rule, tt.times)))
			if w.res.outageAdmitted < tt.least || w.res.outageAdmitted > bound {
				t.Errorf("admitted %d during the outage, want within [%d, %d]", w.res.outageAdmitted, tt.least, bound)
			}
		})
	}
}

// TestEmergencyBucketOutlivesIdleKey: while the region is unreachable, an
// idle key is not forgotten before its emergency bucket has refilled, since
// the key made anew would start with a cost again.
func TestEmergencyBucketOutlivesIdleKey(t *testing.T) {
	// 10 an hour, one agent, headroom 2: a token every 180 s.
	w := newQuotaWorld(t, "{name: r, key: [tenant], limit: 10, period: 1h}", 1, Config{})
	w.downFrom, w.downTo = 0, time.Hour
	var got []bool
	for _, at := range []time.Duration{time.Second, 30 * time.Second, 100 * time.Second, 200 * time.Second} {
		before := w.res.admitted
		w.advance(at)
		w.request(0, tenant)
		w.advance(at + time.Second)
		got = append(got, w.res.admitted > before)
	}
	if want := []bool{true, false, false, true}; !equalBools(got, want) {
		t.Errorf("admitted %v at 1s, 30s, 100s, 200s, want %v: one cost at once, then a token every 180s", got, want)
	}
	if keys := w.agents[0].Stats().Keys; keys != 1 {
		t.Errorf("%d keys held, want the key kept for its bucket", keys)
	}
}

// TestIdleCheckReturnsOnlyExpiringLeases: a key found unused at a check
// (perhaps a moment after the previous one) gives back the tokens of a
// lease about to expire, as a slow quota must, but not those of a later
// lease, which it may still spend.
func TestIdleCheckReturnsOnlyExpiringLeases(t *testing.T) {
	const now = 1000 * ms
	for _, tt := range []struct {
		name       string
		regionRate float64
		want       int64 // returned
	}{
		{"a slow quota gives the expiring lease back", 0.1, 5},
		{"a fast quota lets a few tokens expire", 10000, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := NewDriver(Config{AgentID: "a1"}, time.Unix(0, 0))
			if err != nil {
				t.Fatal(err)
			}
			set := mustPolicy(t, "rules:\n  - "+perDay+"\n")
			d.SetPolicy(set)
			c := &d.c
			k := c.keys.getOrCreate([]byte("r\x00tenant=acme"), func(id []byte) *keyState { return newKeyState(id, 1, now) })
			k.setGrantLocked(tt.regionRate, 0, 100*time.Millisecond)
			k.slots.install(now, now+5*ms, 5)
			k.slots.install(now, now+100*ms, 7)
			k.checkedAsked, k.checkedAt = k.askedLocked(), now-ms // unused since
			rets := &returnBatch{}
			c.check(k, set, now, rets)
			var returned int64
			for _, it := range rets.items {
				returned += it.Tokens
			}
			if returned != tt.want || k.liveTokens(now+50*ms) != 7 {
				t.Errorf("returned %d, %d live after the first lease, want %d and the later lease's 7", returned, k.liveTokens(now+50*ms), tt.want)
			}
		})
	}
}

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
