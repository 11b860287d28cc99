package region

import "math"

// Targets divides total ppm among regions by max-min water-filling and
// returns each region's target share. It is the rule of DESIGN.md, "Each
// epoch", step 3, exported so that it can be tested and plotted on its own.
//
// need[r] is region r's need in ppm: the share that would serve its smoothed
// demand (demand per second / L × PPM). Each region asks for its need plus
// floorPPM of headroom, capped at total:
//
//   - If the asks fit in total, every region gets its ask, and the quota
//     nobody asked for is spread in proportion to weights (the initial
//     shares; equally when all weights are zero), so growth can be absorbed
//     before the next epoch and a key nobody uses drifts back toward its
//     initial shares.
//   - Otherwise a water level λ is found with Σ min(ask, λ) = total: a
//     region asking less than λ gets its ask, the hungry regions split the
//     rest equally.
//
// The result is in integer ppm, sums exactly to total (0 when total ≤ 0),
// and rounds by largest remainder with ties to the lower index, so equal
// needs with equal weights get shares within 1 ppm of each other, and
// raising one need never lowers that region's target by more than 1 ppm.
// Negative or NaN needs count as 0. weights must be nil or as long as need.
func Targets(total int64, need []float64, floorPPM int64, weights []int64) []int64 {
	out := make([]int64, len(need))
	var t targeter
	t.fill(out, total, need, floorPPM, weights)
	return out
}

// targeter holds scratch space so that the per-key loop of Epoch computes
// targets without allocating.
type targeter struct {
	// fits is whether the latest fill served every ask (Σ asks ≤ total);
	// ask holds the asks it computed.
	fits bool
	ask  []float64
	real []float64
	done []bool
	ord  []int
}

func (t *targeter) grow(n int) {
	if cap(t.ask) < n {
		t.ask = make([]float64, n)
		t.real = make([]float64, n)
		t.done = make([]bool, n)
		t.ord = make([]int, n)
	}
	t.ask, t.real, t.done, t.ord = t.ask[:n], t.real[:n], t.done[:n], t.ord[:n]
}

// fill is Targets into out, with t's scratch space.
func (t *targeter) fill(out []int64, total int64, need []float64, floorPPM int64, weights []int64) {
	n := len(need)
	for i := range out {
		out[i] = 0
	}
	if t.fits = false; n == 0 || total <= 0 {
		return
	}
	t.grow(n)
	tot := float64(total)
	sumAsk := t.asks(need, floorPPM, tot)
	if t.fits = sumAsk <= tot; t.fits {
		// Everyone is served; spread the rest by weight.
		t.spread(tot-sumAsk, weights)
	} else {
		t.waterFill(tot)
	}
	t.round(out, total)
}

// asks sets each region's ask, its need plus floorPPM capped at tot, and returns their sum.
func (t *targeter) asks(need []float64, floorPPM int64, tot float64) float64 {
	var sumAsk float64
	for i, v := range need {
		if !(v > 0) { // negative or NaN
			v = 0
		}
		a := v + float64(floorPPM)
		if a > tot {
			a = tot
		}
		t.ask[i] = a
		sumAsk += a
	}
	return sumAsk
}

// spread gives every region its ask plus a part of rest in proportion to weights (or equal parts).
func (t *targeter) spread(rest float64, weights []int64) {
	n := len(t.ask)
	var sumW float64
	for i := range n {
		if weights != nil && weights[i] > 0 {
			sumW += float64(weights[i])
		}
	}
	for i := range n {
		w := 1.0 / float64(n)
		if sumW > 0 {
			w = 0
			if weights[i] > 0 {
				w = float64(weights[i]) / sumW
			}
		}
		t.real[i] = t.ask[i] + rest*w
	}
}

// waterFill divides tot by max-min water-filling, for asks that exceed it.
func (t *targeter) waterFill(tot float64) {
	// Repeatedly satisfy the asks below the current equal split of what is
	// left; the rest share the level.
	n := len(t.ask)
	for i := range t.done {
		t.done[i] = false
	}
	left, hungry := tot, n
	for {
		level := left / float64(hungry)
		fixed := false
		for i := range n {
			if !t.done[i] && t.ask[i] <= level {
				t.done[i] = true
				t.real[i] = t.ask[i]
				left -= t.ask[i]
				hungry--
				fixed = true
			}
		}
		if !fixed || hungry == 0 {
			for i := range n {
				if !t.done[i] {
					t.real[i] = level
				}
			}
			break
		}
	}
}

// round turns t.real into integers summing to total by largest remainder.
func (t *targeter) round(out []int64, total int64) {
	n := len(out)
	var sum int64
	for i := range out {
		v := math.Floor(t.real[i])
		if v < 0 {
			v = 0
		}
		out[i] = int64(v)
		t.real[i] -= v // keep the fractional part for ranking
		sum += out[i]
	}
	// Rank by fractional part, largest first, ties to the lower index.
	for i := range t.ord {
		t.ord[i] = i
	}
	for i := 1; i < n; i++ {
		for j := i; j > 0; j-- {
			a, b := t.ord[j-1], t.ord[j]
			if t.real[b] > t.real[a] {
				t.ord[j-1], t.ord[j] = b, a
				continue
			}
			break
		}
	}
	// Float error can leave the floor sum a unit or so off either way.
	for k := 0; sum < total; k = (k + 1) % n {
		out[t.ord[k]]++
		sum++
	}
	for k := n - 1; sum > total; k = (k + n - 1) % n {
		if i := t.ord[k]; out[i] > 0 {
			out[i]--
			sum--
		}
	}
}
