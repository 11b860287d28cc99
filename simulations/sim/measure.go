package sim

import (
	"math"
	"time"

	"github.com/ration-dev/ration/region"
)

// windows are the window lengths checked against the bound.
var windows = [3]time.Duration{time.Second, 10 * time.Second, 60 * time.Second}

// meter measures a run: admitted tokens per key on a grid, sliding windows
// against the bound, per-second utilisation and fairness, the time series,
// and convergence of shares after demand changes.
type meter struct {
	w            *world
	grid, sample time.Duration
	nw           [3]int64 // window lengths in bins (0: longer than the run)
	ringN        int64
	bin          int64 // bins closed so far
	keys         []keyMeter
	nreg         int

	secAsked, secAdm   []int64 // [key*nreg + region], this second
	utilNum, utilDen   float64
	fairT, fairA       []float64 // per region, seconds when demand ≥ L
	fairTAll, fairAAll []float64
	dem, tgt           []float64 // scratch

	smpAsked, smpAdm []int64 // per region, this sample
	smpRatio         [3]float64
	series           []Sample
	lastSample       int64

	totAsked, totAdmitted, admittedReqs int64
	phases                              []phase
	vs                                  versus

	// The window bound's (windowbound.go): per region, the skew its
	// admissions are counted at; the least, and the largest in magnitude.
	winSkew         []int64
	minSkew, spread int64
	anyWindow       bool // some key is a fixed window
}

type keyMeter struct {
	cur       int64
	ring      []int64
	sum       [3]int64
	base      [3]float64 // the bound without faults, per window
	faults    []faultSpan
	maxExcess [3]float64 // worst admitted − L·W (tokens)
	maxRatio  float64
	over      int64 // windows above the bound
	checked   bool
	win       *windowMeter // a fixed window's: its windows instead
}

// faultSpan is excess a fault allows in windows that meet [from, to]:
// tokens, plus rate tokens per second of the window inside [from, to].
type faultSpan struct {
	from, to int64
	tokens   float64
	rate     float64
}

// phase is a demand step whose share targets convergence is measured to.
type phase struct {
	step       int // its index in Scenario.Demand
	start, end int64
	target     []int64
	done       bool
	took       int64
}

// Sample is one row of the time series.
type Sample struct {
	T float64 // seconds, end of the interval
	// Per region, tokens per second asked and admitted over the interval,
	// and the applied share of the scenario's first key in ppm.
	Asked, Admitted []float64
	Share           []int64
	// Ratio is, per window length, the worst (admitted − L·W) / B over
	// the windows that ended in the interval (any key); NaN when none did.
	Ratio [3]float64
}

func newMeter(w *world) *meter {
	sc := w.sc
	m := &meter{w: w, nreg: len(sc.Regions), grid: sc.Grid, sample: sc.Sample}
	if m.grid == 0 {
		m.grid = sc.Step
		if len(w.keys) > 16 {
			m.grid = max(sc.Step, 10*time.Millisecond)
			m.grid -= m.grid % sc.Step
		}
	}
	if m.sample == 0 {
		m.sample = max(100*time.Millisecond, sc.Duration/1000)
	}
	m.sample = max(m.sample-m.sample%m.grid, m.grid)
	var maxN int64
	for i, win := range windows {
		if win <= sc.Duration {
			m.nw[i] = int64(win / m.grid)
			maxN = max(maxN, m.nw[i])
		}
	}
	m.ringN = maxN + 1
	m.keys = make([]keyMeter, len(w.keys))
	for i := range m.keys {
		km := &m.keys[i]
		km.ring = make([]int64, m.ringN)
		for j := range windows {
			km.base[j] = w.boundBase(&w.keys[i])
			km.maxExcess[j] = math.Inf(-1)
		}
		km.maxRatio = math.Inf(-1)
	}
	m.secAsked = make([]int64, len(w.keys)*m.nreg)
	m.secAdm = make([]int64, len(w.keys)*m.nreg)
	for _, p := range []*[]float64{&m.fairT, &m.fairA, &m.fairTAll, &m.fairAAll, &m.dem, &m.tgt} {
		*p = make([]float64, m.nreg)
	}
	m.smpAsked = make([]int64, m.nreg)
	m.smpAdm = make([]int64, m.nreg)
	m.resetRatio()
	m.vs = newVersus(len(w.keys), len(sc.Demand))
	m.newWindowMeters()
	if w.alg == Escrow {
		m.phases = w.phases()
	}
	return m
}

func (m *meter) resetRatio() {
	for i := range m.smpRatio {
		m.smpRatio[i] = math.Inf(-1)
	}
}

// asked counts a request's tokens as demand.
func (m *meter) asked(key, region int, cost int64) {
	m.secAsked[key*m.nreg+region] += cost
	m.smpAsked[region] += cost
	m.totAsked += cost
}

// admitted counts an admitted request's tokens, at t.
func (m *meter) admitted(key, region int, cost, t int64) {
	if m.keys[key].win != nil {
		m.windowAdmitted(key, region, cost, t)
	} else {
		m.keys[key].cur += cost
	}
	m.secAdm[key*m.nreg+region] += cost
	m.smpAdm[region] += cost
	m.totAdmitted += cost
	m.admittedReqs++
	m.vs.admitted[m.w.demandAt] += cost
}

func (m *meter) addFault(key int, from, to int64, tokens float64) {
	km := &m.keys[key]
	km.faults = append(km.faults, faultSpan{from: from, to: to, tokens: tokens})
}

// closeBin closes the grid bin ending at t and checks every window that
// ends there against the bound.
func (m *meter) closeBin(t int64) {
	b := m.bin
	m.bin++
	slot := b % m.ringN
	for ki := range m.keys {
		km := &m.keys[ki]
		v := km.cur
		km.cur = 0
		if v == 0 && km.sum == [3]int64{} {
			continue // idle: the ring is all zeros already
		}
		k := &m.w.keys[ki]
		for i, n := range m.nw {
			if n == 0 {
				continue
			}
			if b >= n {
				km.sum[i] -= km.ring[(b-n)%m.ringN]
			}
			km.sum[i] += v
			if b+1 < n {
				continue
			}
			km.checked = true
			excess := float64(km.sum[i]) - k.rate*windows[i].Seconds()
			km.maxExcess[i] = max(km.maxExcess[i], excess)
			bound := km.base[i]
			for _, f := range km.faults {
				if start := t - int64(windows[i]); f.from < t && f.to > start {
					bound += f.tokens
					if f.rate > 0 {
						bound += f.rate * float64(min(t, f.to)-max(start, f.from)) / 1e9
					}
				}
			}
			ratio := excess / bound
			km.maxRatio = max(km.maxRatio, ratio)
			m.smpRatio[i] = max(m.smpRatio[i], ratio)
			if ratio > 1 {
				km.over++
			}
		}
		km.ring[slot] = v
	}
}

// closeSecond folds the second that just ended into utilisation and
// fairness.
func (m *meter) closeSecond() {
	for ki := range m.keys {
		k := &m.w.keys[ki]
		row := ki * m.nreg
		var asked, adm float64
		for r := 0; r < m.nreg; r++ {
			m.dem[r] = float64(m.secAsked[row+r])
			asked += m.dem[r]
			adm += float64(m.secAdm[row+r])
		}
		if asked == 0 {
			continue
		}
		waterfill(k.rate, m.dem, m.tgt)
		contended := asked >= k.rate
		if contended {
			m.utilNum += min(adm, k.rate)
			m.utilDen += k.rate
		}
		for r := 0; r < m.nreg; r++ {
			a := float64(m.secAdm[row+r])
			m.fairTAll[r] += m.tgt[r]
			m.fairAAll[r] += a
			if contended {
				m.fairT[r] += m.tgt[r]
				m.fairA[r] += a
			}
			m.secAsked[row+r], m.secAdm[row+r] = 0, 0
		}
	}
}

// closeSample appends the time series' row for the interval ending at t.
func (m *meter) closeSample(t int64) {
	span := float64(t-m.lastSample) / 1e9
	if span <= 0 {
		return
	}
	s := Sample{T: float64(t) / 1e9, Asked: make([]float64, m.nreg), Admitted: make([]float64, m.nreg), Share: make([]int64, m.nreg), Ratio: m.smpRatio}
	for r := 0; r < m.nreg; r++ {
		s.Asked[r] = float64(m.smpAsked[r]) / span
		s.Admitted[r] = float64(m.smpAdm[r]) / span
		m.smpAsked[r], m.smpAdm[r] = 0, 0
		s.Share[r] = m.w.appliedShare(r)
	}
	for i := range s.Ratio {
		if math.IsInf(s.Ratio[i], -1) {
			s.Ratio[i] = math.NaN() // no window of this length ended yet
		}
	}
	m.series = append(m.series, s)
	m.lastSample = t
	m.resetRatio()
}

// appliedShare is region r's share of the first key as its bucket sees it
// (keyShare).
func (w *world) appliedShare(r int) int64 {
	switch w.alg {
	case Ideal:
		return region.PPM / int64(len(w.rs))
	case Static:
		return w.rs[r].initial
	}
	return w.keyShare(w.rs[r], w.keys[0].storeKey)
}

// keyShare is region r's share of key as its bucket sees it: the store's,
// or a raise the share keeper keeps, which the key's next grant applies
// from when it was made.
func (w *world) keyShare(r *regiond, key string) int64 {
	if r.keeper != nil {
		if ppm, ok := r.keeper.KeptShare(key); ok {
			return ppm
		}
	}
	return w.share(r, r.store, key)
}

// phases lists the demand steps whose targets convergence is measured to:
// every step that does not alternate, from the end of its ramp to the next
// step. Targets are region.Targets of the first key's needs at the step's
// rates, as the exchange computes them from steady demand.
func (w *world) phases() []phase {
	sc := w.sc
	k := &w.keys[0]
	frac := w.pick.weight(0)
	floor := w.rs[0].node.Config().FloorPPM
	weights := make([]int64, len(w.rs))
	for i, r := range w.rs {
		weights[i] = r.initial
	}
	var out []phase
	for i, d := range sc.Demand {
		end := sc.Duration
		if i+1 < len(sc.Demand) {
			end = sc.Demand[i+1].At
		}
		if d.Every > 0 || d.At+d.Ramp >= end {
			continue
		}
		need := make([]float64, len(w.rs))
		for ri, name := range sc.Regions {
			need[ri] = d.Rates[name] * frac * float64(k.cost) / k.rate * region.PPM
		}
		out = append(out, phase{step: i, start: int64(d.At + d.Ramp), end: int64(end), target: region.Targets(region.PPM, need, floor, weights)})
	}
	return out
}

// checkConvergence notes, at t, the demand phases whose targets every
// region's applied share is now within ±5% (50,000 ppm) of.
func (m *meter) checkConvergence(t int64) {
	for i := range m.phases {
		p := &m.phases[i]
		if p.done || t < p.start || t >= p.end {
			continue
		}
		ok := true
		for r := range m.w.rs {
			if d := m.w.appliedShare(r) - p.target[r]; d > 50_000 || d < -50_000 {
				ok = false
				break
			}
		}
		if ok {
			p.done, p.took = true, t-p.start
		}
	}
}

// boundBase is B for key k without faults, the same for every window
// length: b + L·τ (where agents serve) + the RLQS proxies' terms (where
// proxies serve, proxyBound) + one cost per region whose b × (least
// share) is below a cost.
// The least share a region's bucket may run at is, for escrow, the
// exchange's floor (max-min targets never go below it), for static its
// fixed share; the ideal bucket is one bucket of b with no leases.
func (w *world) boundBase(k *simKey) float64 {
	if w.alg == Ideal {
		return k.burst
	}
	b := k.burst + w.proxyBound(k)
	if w.agentsServe() {
		b += k.rate * w.sc.LeaseTTL.Seconds()
	}
	for _, r := range w.rs {
		if w.belowCost(r, k) {
			b += float64(k.cost)
		}
	}
	return b
}

// belowCost reports whether region r's bucket of key k may run at a share
// whose b × share is below a cost, so that its capacity is one cost.
func (w *world) belowCost(r *regiond, k *simKey) bool {
	least := r.initial
	if w.alg == Escrow {
		least = min(least, r.node.Config().FloorPPM)
	}
	return k.burst*float64(least)/region.PPM < float64(k.cost)
}
