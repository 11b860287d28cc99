package sim

import (
	"math"
	"math/rand/v2"
)

func pow(x, y float64) float64 { return math.Pow(x, y) }

// poissonDraw draws Poisson variates: by inverting the distribution
// function with one uniform for means up to 500, by a normal approximation
// above, where its error is far below the run's own noise. It keeps
// exp(-mean) for the last mean, which steady demand repeats every step.
type poissonDraw struct {
	mean, exp float64
}

func (p *poissonDraw) draw(rng *rand.Rand, mean float64) int {
	switch {
	case !(mean > 0):
		return 0
	case mean <= 500:
		if mean != p.mean {
			p.mean, p.exp = mean, math.Exp(-mean)
		}
		u := rng.Float64()
		k, pk := 0, p.exp
		cdf := pk
		for u > cdf && pk > 0 {
			k++
			pk *= mean / float64(k)
			cdf += pk
		}
		return k
	default:
		return max(0, int(math.Round(mean+math.Sqrt(mean)*rng.NormFloat64())))
	}
}

// alias draws an index with given weights in O(1) (Vose's alias method).
type alias struct {
	prob    []float64
	other   []int32
	weights []float64 // normalised
}

// weight returns the probability of index i.
func (a *alias) weight(i int) float64 {
	if len(a.weights) <= 1 {
		return 1
	}
	return a.weights[i]
}

func newAlias(weights []float64) alias {
	n := len(weights)
	a := alias{prob: make([]float64, n), other: make([]int32, n)}
	if n <= 1 {
		return a
	}
	var sum float64
	for _, x := range weights {
		sum += x
	}
	a.weights = make([]float64, n)
	for i, x := range weights {
		a.weights[i] = x / sum
	}
	scaled := make([]float64, n)
	var small, large []int32
	for i, x := range weights {
		scaled[i] = x / sum * float64(n)
		if scaled[i] < 1 {
			small = append(small, int32(i))
		} else {
			large = append(large, int32(i))
		}
	}
	for len(small) > 0 && len(large) > 0 {
		s, l := small[len(small)-1], large[len(large)-1]
		small, large = small[:len(small)-1], large[:len(large)-1]
		a.prob[s], a.other[s] = scaled[s], l
		scaled[l] -= 1 - scaled[s]
		if scaled[l] < 1 {
			small = append(small, l)
		} else {
			large = append(large, l)
		}
	}
	for _, i := range large {
		a.prob[i] = 1
	}
	for _, i := range small {
		a.prob[i] = 1
	}
	return a
}

func (a *alias) draw(rng *rand.Rand) int {
	n := len(a.prob)
	if n <= 1 {
		return 0
	}
	i := rng.IntN(n)
	if rng.Float64() < a.prob[i] {
		return i
	}
	return int(a.other[i])
}

// waterfill divides total among demands max-min fairly: a demand below the
// level gets all it asks, the others the level. It writes the targets to
// out.
func waterfill(total float64, demand, out []float64) {
	n := len(demand)
	var sum float64
	for _, d := range demand {
		sum += d
	}
	if sum <= total {
		copy(out, demand)
		return
	}
	done := make([]bool, n)
	left, hungry := total, n
	for {
		level := left / float64(hungry)
		fixed := false
		for i, d := range demand {
			if !done[i] && d <= level {
				done[i], out[i] = true, d
				left -= d
				hungry--
				fixed = true
			}
		}
		if !fixed || hungry == 0 {
			for i := range demand {
				if !done[i] {
					out[i] = level
				}
			}
			return
		}
	}
}

// reportDraw is the random draw of the report region from (with whether
// it is an exchange report, in the low bit) publishes to region to at t: a
// hash of the run's seed and the message, not a draw from a stream, so that
// which reports are lost and how late they arrive does not depend on what
// else the run drew before. Two versions of the code, or two
// configurations, then meet the same network wherever they send the same
// messages at the same times (common random numbers), and a change to the
// agents' traffic no longer moves which report is lost (issue 12's
// failover-lost-gift at seed 12 lost us's report to eu at 30.96 s on one
// side of such a change only, and eu's lowering came an epoch later). An
// agent's calls draw their round trips the same way (callDraw).
func reportDraw(seed, from, to, t uint64) uint64 {
	h := mix64(seed ^ 0x7265706f7274) // "report"
	h = mix64(h ^ from<<32 ^ to)
	return mix64(h ^ t)
}

// callDraw is the random draw of agent's n-th call sent at t (callNumber).
func callDraw(seed, agent, t, n uint64) uint64 {
	h := mix64(seed ^ 0x63616c6c) // "call"
	h = mix64(h ^ agent)
	return mix64(h ^ t ^ n<<56)
}

// faultDraw is fault i's n-th random draw, independent of the run's
// other draws like reportDraw.
func faultDraw(seed, i, n uint64) uint64 {
	return mix64(mix64(seed^0x6661756c74) ^ i<<32 ^ n) // "fault"
}

// mix64 is splitmix64's finalizer: a bijection that scatters every input
// bit over the output.
func mix64(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
