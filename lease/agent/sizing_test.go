package agent

import (
	"math"
	"testing"
	"time"
)

func TestSpendRateFastUpSlowDown(t *testing.T) {
	p := newRateParams(50 * time.Millisecond)
	e := newSpendRate()
	e.observe(0, 0, p)
	// 1000 tokens/s for one lease period: the estimate reaches most of it
	// at once (1 − e^−2 with the up constant of half a period).
	e.observe(50*ms, 50, p)
	if e.rate < 850 || e.rate > 1000 {
		t.Errorf("after one lease period at 1000/s got %.0f, want within [850, 1000]", e.rate)
	}
	for i := int64(2); i <= 10; i++ {
		e.observe(i*50*ms, i*50, p)
	}
	if math.Abs(float64(e.rate)-1000) > 1 {
		t.Errorf("steady 1000/s got %.1f", e.rate)
	}
	// Demand stops: after 100ms the estimate has fallen by under 10%.
	e.observe(600*ms, 500, p)
	if e.rate < 900 {
		t.Errorf("100ms after demand stopped got %.0f, want at least 900 (slow down)", e.rate)
	}
	// A burst within microseconds is measured over the minimum window.
	b := newSpendRate()
	b.observe(0, 0, p)
	b.observe(1000, 10, p) // 10 tokens in 1µs
	if float64(b.rate) > 10/p.window.Seconds() {
		t.Errorf("burst read as %.0f/s, want at most %.0f/s", b.rate, 10/p.window.Seconds())
	}
}

func TestLeaseSize(t *testing.T) {
	tests := []struct {
		name     string
		rate     float64
		need     int64
		waiting  int64
		cost     int64
		capacity float64
		agents   int64
		prev     int64
		want     int64
	}{
		{"rate times period plus lead", 1000, 1, 0, 1, 1e6, 1, 0, 55},
		{"cold key asks what the request needs", 0, 3, 0, 1, 1e6, 1, 0, 3},
		{"at least one cost", 0, 1, 0, 10, 1e6, 1, 0, 10},
		{"rounded up to whole costs", 1000, 1, 0, 10, 1e6, 1, 0, 60},
		{"capped at the fair share of capacity", 1e6, 1, 0, 1, 1000, 4, 0, 250},
		{"the request's need beats the cap", 1e6, 400, 0, 1, 1000, 4, 0, 400},
		{"no capacity known yet: uncapped", 1e4, 1, 0, 1, 0, 1, 0, 550},
		{"agents unknown count as one", 1e6, 1, 0, 1, 100, 0, 0, 100},
		{"at most twice the previous ask", 1e4, 1, 0, 1, 1e6, 1, 20, 40},
		{"shrinking is not capped", 10, 1, 0, 1, 1e6, 1, 500, 1},
		{"waiting requests are asked for at once, past the doubling", 10, 1, 49, 1, 1e6, 1, 1, 49},
		{"waiting requests within the fair share", 10, 1, 500, 1, 1000, 4, 1, 250},
		{"waiting requests in whole costs", 0, 5, 7, 5, 1e6, 1, 0, 10},
	}
	for _, tt := range tests {
		got := leaseSize(tt.rate, 50*time.Millisecond, 5*time.Millisecond, tt.need, tt.waiting, tt.cost, tt.capacity, tt.agents, tt.prev)
		if got != tt.want {
			t.Errorf("%s: got %d, want %d", tt.name, got, tt.want)
		}
	}
	if got := lowWater(1000, 5*time.Millisecond, 1); got != 5 {
		t.Errorf("lowWater(1000/s, 5ms) got %d, want 5", got)
	}
	if got := lowWater(10, 5*time.Millisecond, 3); got != 3 {
		t.Errorf("lowWater of a slow key got %d, want one cost, 3", got)
	}
}

func TestHoldAfter(t *testing.T) {
	const period = 50 * ms
	tests := []struct {
		name                 string
		granted, want, retry int64
		rate, capacity       float64
		hold                 int64
	}{
		{"full grant: no hold", 10, 10, 0, 100, 100, 0},
		{"half grant: half a period", 5, 10, 0, 100, 100, 25 * ms},
		{"zero grant: a whole period", 0, 10, 1 * ms, 100, 100, 50 * ms},
		{"zero grant: the region's retry when longer", 0, 10, 300 * ms, 100, 100, 300 * ms},
		{"small bucket: at most half its fill time", 0, 10, 1 * ms, 1000, 10, 5 * ms},
	}
	for _, tt := range tests {
		if got := holdAfter(tt.granted, tt.want, tt.retry, period, tt.rate, tt.capacity); got != tt.hold {
			t.Errorf("%s: got %v, want %v", tt.name, time.Duration(got), time.Duration(tt.hold))
		}
	}
}
