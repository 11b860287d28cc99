package sim

import (
	"math"
	"time"

	"github.com/ration-dev/ration/region"
)

// The bound for fixed windows (DESIGN.md): for every fixed-window key and
// every window, the tokens admitted under the window are at most its
// limit, plus one cost per region whose limit × least share is below a
// cost, plus the fault terms of the windows it meets. The sliding windows
// of L·W + B are not checked for such keys: a fixed window admits its
// limit on each side of a boundary, up to twice the limit within a
// moment, as it should.
//
// Each region's store picks its window on its own clock, skewed from true
// time, and its leases end with that window (lease/service clips their TTL
// to it), so a request admitted in region r at true time t was granted
// from the window that holds t + r's store skew: that is the window it is
// counted in. In true time a boundary is blurred by the stores' skews.
//
// Skew adds one term. A region's bucket enters a window full at the share
// it has then, and a share it gains later in the window brings only the
// tokens given with it; but a region whose clock is behind can still be in
// the window before when another region, already in the new window (and
// full at a share that included the gift), gives it share: it enters the
// new window full at the raised share, and that share is counted twice. So
// a share raised while some region's store is already in a later window
// adds limit × the raise to the window the raised region enters next.

// windowMeter counts a fixed-window key's admissions per window.
type windowMeter struct {
	open     []meterWindow // windows still counting, by start
	base     float64       // the bound without faults
	windows  int64         // windows checked
	over     int64         // windows above the bound
	maxRatio float64
	maxFill  float64 // admitted ÷ limit
}

// meterWindow is one window on the stores' clocks, in ns since the run's
// start.
type meterWindow struct {
	start, end int64
	admitted   int64
}

// newWindowMeters sets up the window meters of the fixed-window keys and
// the skew each region's admissions are counted at.
func (m *meter) newWindowMeters() {
	w := m.w
	m.winSkew = make([]int64, m.nreg)
	for i, r := range w.rs {
		if w.alg != Ideal { // the ideal bucket runs on true time
			m.winSkew[i] = r.storeSkew
		}
		if i == 0 || m.winSkew[i] < m.minSkew {
			m.minSkew = m.winSkew[i]
		}
		m.spread = max(m.spread, abs64(m.winSkew[i]))
	}
	for ki := range w.keys {
		if !w.keys[ki].rule.FixedWindow() {
			continue
		}
		m.keys[ki].win = &windowMeter{base: w.windowBase(&w.keys[ki]), maxRatio: math.Inf(-1), maxFill: math.Inf(-1)}
		m.anyWindow = true
	}
}

// windowBase is the window bound of key k without faults: its limit plus
// one cost per region whose limit × (least share) is below a cost; the
// ideal bucket's is its limit.
func (w *world) windowBase(k *simKey) float64 {
	b := k.burst // a fixed window's burst is its limit
	if w.alg == Ideal {
		return b
	}
	for _, r := range w.rs {
		if w.belowCost(r, k) {
			b += float64(k.cost)
		}
	}
	return b
}

// windowAdmitted counts cost tokens of fixed-window key ki admitted in
// region ri at t, and checks the windows no region can admit in any more.
func (m *meter) windowAdmitted(ki, ri int, cost, t int64) {
	wm := m.keys[ki].win
	a := t + m.winSkew[ri]
	i := len(wm.open) - 1
	for i >= 0 && a < wm.open[i].start {
		i--
	}
	if i < 0 || a >= wm.open[i].end {
		start, end := m.w.keys[ki].rule.Window(m.w.base.Add(time.Duration(a)))
		i++
		wm.open = append(wm.open, meterWindow{})
		copy(wm.open[i+1:], wm.open[i:])
		wm.open[i] = meterWindow{start: int64(start.Sub(m.w.base)), end: int64(end.Sub(m.w.base))}
	}
	wm.open[i].admitted += cost
	// Every region's store is past the windows that end by t + minSkew.
	n := 0
	for n < len(wm.open) && wm.open[n].end <= t+m.minSkew {
		m.checkWindow(ki, wm.open[n])
		n++
	}
	wm.open = append(wm.open[:0], wm.open[n:]...)
}

// closeWindows checks every window still open at the end of the run.
func (m *meter) closeWindows() {
	for ki := range m.keys {
		if wm := m.keys[ki].win; wm != nil {
			for _, win := range wm.open {
				m.checkWindow(ki, win)
			}
			wm.open = wm.open[:0]
		}
	}
}

// checkWindow checks one window of key ki against its bound. Fault spans
// are in true time and windows on the stores' clocks, so a span counts in
// every window it meets once widened by the largest skew.
func (m *meter) checkWindow(ki int, win meterWindow) {
	km := &m.keys[ki]
	wm := km.win
	from, to := win.start-m.spread, win.end+m.spread
	bound := wm.base
	for _, f := range km.faults {
		if f.from < to && f.to > from {
			bound += f.tokens
			if f.rate > 0 {
				bound += f.rate * float64(min(to, f.to)-max(from, f.from)) / 1e9
			}
		}
	}
	wm.windows++
	wm.maxFill = max(wm.maxFill, float64(win.admitted)/float64(m.w.keys[ki].rule.Limit))
	if math.IsInf(bound, 1) {
		return // a rule failing open has no bound while it does
	}
	ratio := float64(win.admitted) / bound
	wm.maxRatio = max(wm.maxRatio, ratio)
	if ratio > 1 {
		wm.over++
	}
}

// noteWindowRaises adds, before region r writes the shares cs, the skew
// term of every fixed-window key whose share rises while r's store is in
// an earlier window than the most advanced store's.
func (w *world) noteWindowRaises(r *regiond, cs []region.ShareChange) {
	if !w.m.anyWindow || w.alg != Escrow {
		return
	}
	ahead := r.storeSkew
	for _, q := range w.rs {
		ahead = max(ahead, q.storeSkew)
	}
	if ahead == r.storeSkew {
		return
	}
	for _, c := range cs {
		ki, ok := w.windowKeys[c.Key]
		if !ok {
			continue
		}
		old := w.share(r, r.store, c.Key)
		if c.SharePPM <= old {
			continue
		}
		k := &w.keys[ki]
		start, end := k.rule.Window(w.regionTime(r))
		if lead, _ := k.rule.Window(w.base.Add(dur(w.now + ahead))); !lead.After(start) {
			continue
		}
		at := int64(end.Sub(w.base)) // r enters the next window then
		w.m.addFault(ki, at, at+1, k.burst*float64(c.SharePPM-old)/region.PPM)
	}
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// windowBound summarises the window meters; nil without fixed-window keys.
func (m *meter) windowBound() *WindowBound {
	if !m.anyWindow {
		return nil
	}
	b := &WindowBound{BoundTokens: math.Inf(-1)}
	ratio, fill := math.Inf(-1), math.Inf(-1)
	for ki := range m.keys {
		wm := m.keys[ki].win
		if wm == nil {
			continue
		}
		if math.IsInf(b.BoundTokens, -1) {
			b.BoundTokens = round4(wm.base)
		}
		b.Windows += wm.windows
		b.WindowsOver += wm.over
		ratio, fill = max(ratio, wm.maxRatio), max(fill, wm.maxFill)
	}
	if !math.IsInf(ratio, -1) {
		b.RatioMax = round4(ratio)
	}
	if !math.IsInf(fill, -1) {
		b.AdmittedMaxPct = round4(fill * 100)
	}
	return b
}
