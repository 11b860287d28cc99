package agent

import (
	"testing"
	"time"
)

func TestBreaker(t *testing.T) {
	b := breaker{threshold: 3, probeEvery: 100 * ms}
	type step struct {
		now  int64
		op   string // "allow", "ok", "fail"
		want bool   // allow's answer, or whether the state changed
		open bool
	}
	steps := []step{
		{0, "allow", true, false},
		{1, "fail", false, false},
		{2, "fail", false, false},
		{3, "ok", false, false}, // resets the count
		{4, "fail", false, false},
		{5, "fail", false, false},
		{6, "fail", true, true}, // third in a row opens
		{7, "allow", false, true},
		{105, "allow", false, true},
		{106, "allow", true, true},  // the probe
		{107, "allow", false, true}, // one probe at a time
		{110, "fail", false, true},
		{200, "allow", false, true},
		{210, "allow", true, true},
		{215, "ok", true, false}, // the probe succeeded: closed
		{216, "allow", true, false},
	}
	for i, st := range steps {
		now := st.now * ms
		var got bool
		switch st.op {
		case "allow":
			got = b.allow(now)
		default:
			opened, closed := b.done(now, st.op == "ok")
			got = opened || closed
		}
		if got != st.want || b.open != st.open {
			t.Fatalf("step %d (%s at %dms): got %v open=%v, want %v open=%v", i, st.op, st.now, got, b.open, st.want, st.open)
		}
	}
}

func TestEmergencyBucket(t *testing.T) {
	var e emergency
	// 100 tokens/s, capacity 10: starts empty.
	ok, activated, wait := e.take(0, 1, 100, 10)
	if ok || !activated || wait != 10*ms+1 {
		t.Fatalf("first take got ok=%v activated=%v wait=%v, want false true 10ms", ok, activated, time.Duration(wait))
	}
	if ok, activated, _ = e.take(10*ms, 1, 100, 10); !ok || activated {
		t.Errorf("take after 10ms got ok=%v activated=%v, want true false", ok, activated)
	}
	// Over one second at most 100 tokens (plus nothing banked).
	admitted := 0
	for now := 10 * ms; now <= 1010*ms; now += ms / 2 {
		if ok, _, _ := e.take(now, 1, 100, 10); ok {
			admitted++
		}
	}
	if admitted > 100 {
		t.Errorf("admitted %d in 1s at 100/s", admitted)
	}
	e.give(5, 10)
	if e.tokens > 10 {
		t.Errorf("give overfilled: %v > capacity 10", e.tokens)
	}
}
