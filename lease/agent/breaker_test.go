package agent

import (
	"math"
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
	// 100 tokens/s, starting with 1, banking up to 10 while in use.
	ok, activated, _ := e.take(0, 1, 100, 1, 10)
	if !ok || !activated {
		t.Fatalf("first take got ok=%v activated=%v, want true true: a bucket starts with its start", ok, activated)
	}
	ok, activated, wait := e.take(0, 1, 100, 1, 10)
	if ok || activated || wait != 10*ms+1 {
		t.Fatalf("second take got ok=%v activated=%v wait=%v, want false false 10ms", ok, activated, time.Duration(wait))
	}
	if ok, activated, _ = e.take(10*ms, 1, 100, 1, 10); !ok || activated {
		t.Errorf("take after 10ms got ok=%v activated=%v, want true false", ok, activated)
	}
	// Over one second at most 100 tokens (plus nothing banked).
	admitted := 0
	for now := 10 * ms; now <= 1010*ms; now += ms / 2 {
		if ok, _, _ := e.take(now, 1, 100, 1, 10); ok {
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
	// In use it banks up to its capacity; idle, only up to its start.
	e.take(2000*ms, 10, 100, 1, 10)
	e.refill(3000*ms, 100, 1, 10)
	if e.tokens != 10 {
		t.Errorf("in use for 1s: holds %v, want the capacity, 10", e.tokens)
	}
	e.idle(3000*ms, 100, 1, 10)
	e.refill(9000*ms, 100, 1, 10)
	if e.tokens != 1 || e.active {
		t.Errorf("idle: holds %v (active %v), want its start, 1", e.tokens, e.active)
	}
	// A slow quota's first request is admitted, the next waits for the rate.
	var slow emergency
	if ok, _, _ := slow.take(0, 1, 0.005, 1, 20); !ok {
		t.Error("first take of a slow bucket denied, want its start admitted")
	}
	if ok, _, wait := slow.take(ms, 1, 0.005, 1, 20); ok || time.Duration(wait) < 199*time.Second {
		t.Errorf("second take got ok=%v wait=%v, want a denial for 200s", ok, time.Duration(wait))
	}
}

// TestEmergencyBucketFlapping: a region that fails and answers by turns
// (each answer ends the bucket's use) gives no new start each time: in any
// window the bucket admits at most its start and its rate.
func TestEmergencyBucketFlapping(t *testing.T) {
	var e emergency
	admitted := 0
	for now := int64(0); now < 1000*ms; now += ms {
		if ok, _, _ := e.take(now, 1, 100, 5, 10); ok {
			admitted++
		}
		e.idle(now, 100, 5, 10)
	}
	if admitted > 5+100 {
		t.Errorf("admitted %d in 1s at 100/s with a start of 5, want at most 105", admitted)
	}
}

func TestEmergencyBucketFull(t *testing.T) {
	var e emergency
	if got := e.full(5*ms, 100, 1); got != 5*ms {
		t.Errorf("a bucket never used is full at %v, want now", got)
	}
	e.take(0, 1, 100, 1, 10) // spends its start
	if got := e.full(0, 100, 1); got != 10*ms {
		t.Errorf("empty at 0 refilling 100/s: 1 token at %v, want 10ms", time.Duration(got))
	}
	if got := e.full(4*ms, 100, 10); got != 100*ms {
		t.Errorf("asked at 4ms: 10 tokens at %v, want 100ms", time.Duration(got))
	}
	if got := e.full(20*ms, 100, 1); got != 20*ms {
		t.Errorf("asked at 20ms: 1 token at %v, want now", time.Duration(got))
	}
	if got := e.full(0, 0, 1); got != math.MaxInt64 {
		t.Errorf("never refilling: full at %v, want never", got)
	}
}
