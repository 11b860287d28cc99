package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/ration-dev/ration/lease/agent"
)

// Summary is a run's results: summary.json. Every field but WallSeconds is
// a function of the scenario and its seed.
type Summary struct {
	Scenario  string    `json:"scenario"`
	Seed      uint64    `json:"seed"`
	Algorithm Algorithm `json:"algorithm"`
	DurationS float64   `json:"duration_s"`
	Regions   []string  `json:"regions"`
	// Agents and RLQS proxies at the start, and keys.
	Agents  int `json:"agents"`
	Proxies int `json:"proxies,omitempty"`
	Keys    int `json:"keys"`
	// Requests is the number of requests decided; Demanded and Admitted
	// are tokens asked for and admitted.
	Requests int64 `json:"requests"`
	Demanded int64 `json:"demanded"`
	Admitted int64 `json:"admitted"`
	// IdealAdmitted is what one ideal bucket per key (rate L, capacity b,
	// full at the start, no latency) admits when asked by the run's own
	// requests at their instants; VersusIdealPct is Admitted ÷ that, in
	// percent (null when it admitted nothing). Unlike UtilizationPct, which
	// clips every second at L, it counts the tokens a bucket holds: for a
	// long period almost all of the quota. Above 100 is admitted beyond
	// what one bucket would have, within the bound's B.
	IdealAdmitted  int64    `json:"ideal_admitted"`
	VersusIdealPct *float64 `json:"admitted_vs_ideal_pct"`
	// Steps is, per demand step, admitted against the ideal buckets and,
	// for escrow, the step's convergence.
	Steps []StepSummary `json:"steps"`
	// OvershootPct is, per window length, the worst excess over L·W in
	// percent of L·W, over every key and window (negative: never reached
	// L·W). It includes the burst b, which the ideal bucket also admits.
	OvershootPct PerWindow `json:"overshoot_pct"`
	// ExcessOverIdealPct is the worst (admitted − L·W − b) / (L·W): the
	// excess over what the ideal bucket could ever admit.
	ExcessOverIdealPct PerWindow `json:"excess_over_ideal_pct"`
	// BoundTokens is B of the first key without faults, per window.
	BoundTokens PerWindow `json:"bound_tokens"`
	// BoundRatioMax is the worst (admitted − L·W) / B over every key and
	// window; above 1 the bound is broken. WindowsOverBound counts those.
	BoundRatioMax    float64 `json:"bound_ratio_max"`
	WindowsOverBound int64   `json:"windows_over_bound"`
	// WindowBound is the fixed-window keys' check against the bound of one
	// window, which replaces the sliding windows above for them; absent
	// when the run has no fixed-window key.
	WindowBound *WindowBound `json:"window_bound,omitempty"`
	// UtilizationPct is Σ min(admitted, L) / Σ L over the one-second
	// windows (per key) whose demand was at least L; null when none was.
	UtilizationPct *float64 `json:"utilization_pct"`
	// JainFairness is Jain's index over regions of admitted ÷ max-min
	// target (L water-filled over the regions' demand), summed over the
	// contended seconds of every key (every second if none was contended).
	JainFairness float64 `json:"jain_fairness"`
	// ServedPct is, per region, admitted ÷ max-min target in percent over
	// the same seconds as JainFairness; LeastServedPct its minimum, the
	// worst-served region (max-min fairness's own measure). Jain's index
	// is 1 when every region gets the same fraction of its target, however
	// small; this says how large that fraction is.
	ServedPct      map[string]float64 `json:"served_pct"`
	LeastServedPct float64            `json:"least_served_pct"`
	// ConvergenceS is the worst time, after each demand change settles,
	// until every region's share of the first key is within ±5% of its
	// max-min target; a change never converged counts its whole phase and
	// in UnconvergedChanges. Null for static and ideal.
	ConvergenceS       *float64 `json:"convergence_s"`
	UnconvergedChanges int      `json:"unconverged_changes"`
	NatsMsgsPerS       float64  `json:"nats_msgs_per_s"`
	NatsBytesPerS      float64  `json:"nats_bytes_per_s"`
	// StoreOpsPerAdmitted counts allocator operations (lease and return
	// items that reach the store, share writes; for ideal, one per
	// request) per admitted request.
	StoreOpsPerAdmitted float64 `json:"store_ops_per_admitted"`
	// StoreOps is what StoreOpsPerAdmitted counts, by cause: grant items
	// (probe: those of them that probed a key the lease service remembered
	// dry), return items and share writes; absent for ideal.
	StoreOps *StoreOps `json:"store_ops,omitempty"`
	// SyncDecisionPct is the share of decisions that waited for a round
	// trip; DroppedPct the leased tokens dropped unspent at expiry.
	SyncDecisionPct float64          `json:"sync_decision_pct"`
	DroppedPct      float64          `json:"dropped_pct"`
	Paths           map[string]int64 `json:"paths,omitempty"`
	// RLQS is what the proxies' assignments held against the bound's
	// assumptions; absent without proxies.
	RLQS         *RLQSSummary `json:"rlqs,omitempty"`
	ReportsStale int64        `json:"reports_stale"`
	ReportErrors int64        `json:"report_errors"`
	// WallSeconds is the run's wall-clock time: the only field that
	// differs between two runs of the same scenario and seed.
	WallSeconds float64 `json:"wall_s"`
}

// StoreOps counts store operations by cause over a run.
type StoreOps struct {
	Grant      int64 `json:"grant"`
	Probe      int64 `json:"probe"`
	Return     int64 `json:"return"`
	ShareWrite int64 `json:"share_write"`
}

// WindowBound is how the fixed-window keys' windows kept the window bound
// (DESIGN.md, "The bound for fixed windows"): admitted under a window ≤
// its limit + one cost per region whose limit × least share is below a
// cost + the fault terms. A request is counted in the window its region's
// store was in, on that store's clock.
type WindowBound struct {
	// Windows is how many windows admitted anything, over every
	// fixed-window key; a window the run covers in part counts too.
	Windows int64 `json:"windows"`
	// BoundTokens is the bound of the first fixed-window key's windows
	// without faults.
	BoundTokens float64 `json:"bound_tokens"`
	// AdmittedMaxPct is the most one window admitted, in percent of its
	// key's limit.
	AdmittedMaxPct float64 `json:"admitted_max_pct"`
	// RatioMax is the worst admitted ÷ bound over every window; above 1 the
	// bound is broken, in WindowsOver windows.
	RatioMax    float64 `json:"ratio_max"`
	WindowsOver int64   `json:"windows_over"`
}

// BoundBroken reports whether any window exceeded its bound: a sliding
// window of a token bucket, or a fixed window.
func (s *Summary) BoundBroken() bool {
	return s.BoundRatioMax > 1 || s.WindowsOverBound > 0 || (s.WindowBound != nil && (s.WindowBound.RatioMax > 1 || s.WindowBound.WindowsOver > 0))
}

// PerWindow holds one value per window length; null when the run is
// shorter than the window.
type PerWindow struct {
	S1  *float64 `json:"1s"`
	S10 *float64 `json:"10s"`
	S60 *float64 `json:"60s"`
}

func (p *PerWindow) set(i int, v float64) {
	x := round4(v)
	switch i {
	case 0:
		p.S1 = &x
	case 1:
		p.S10 = &x
	case 2:
		p.S60 = &x
	}
}

// Get returns the value for window i (0: 1s, 1: 10s, 2: 60s).
func (p PerWindow) Get(i int) *float64 { return [3]*float64{p.S1, p.S10, p.S60}[i] }

func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }
func round3(x float64) float64 { return math.Round(x*1e3) / 1e3 }

// JSON returns the summary as indented JSON with a final newline.
func (s *Summary) JSON() []byte {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		panic(err) // no field can fail to marshal
	}
	return append(b, '\n')
}

func (w *world) result() *Result {
	sc, m := w.sc, w.m
	s := Summary{
		Scenario: sc.Name, Seed: sc.Seed, Algorithm: w.alg, DurationS: sc.Duration.Seconds(),
		Regions: sc.Regions, Agents: sc.AgentsPerRegion * len(sc.Regions), Keys: len(w.keys),
		Demanded: m.totAsked, Admitted: m.totAdmitted,
		BoundRatioMax: math.Inf(-1),
		ReportsStale:  w.recvStale, ReportErrors: w.recvErrors,
	}
	if w.alg == Ideal {
		s.Agents = 0
	}
	if w.px != nil {
		s.Proxies = w.px.initial
		for _, r := range w.rs {
			if r.proxied() {
				s.Agents -= sc.AgentsPerRegion
			}
		}
	}
	s.IdealAdmitted = sum64(m.vs.idealAdmitted)
	s.VersusIdealPct = ratioPct(s.Admitted, s.IdealAdmitted)
	s.Steps = w.steps()
	for i, n := range m.nw {
		if n == 0 {
			continue
		}
		over, overIdeal := math.Inf(-1), math.Inf(-1)
		lw := windows[i].Seconds()
		for ki := range m.keys {
			km, k := &m.keys[ki], &w.keys[ki]
			if !km.checked || math.IsInf(km.maxExcess[i], -1) {
				continue
			}
			over = max(over, km.maxExcess[i]/(k.rate*lw)*100)
			overIdeal = max(overIdeal, (km.maxExcess[i]-k.burst)/(k.rate*lw)*100)
		}
		if !math.IsInf(over, -1) {
			s.OvershootPct.set(i, over)
			s.ExcessOverIdealPct.set(i, overIdeal)
		}
		if m.keys[0].win == nil {
			s.BoundTokens.set(i, m.keys[0].base[i])
		}
	}
	s.WindowBound = m.windowBound()
	for ki := range m.keys {
		km := &m.keys[ki]
		if km.checked {
			s.BoundRatioMax = max(s.BoundRatioMax, km.maxRatio)
		}
		s.WindowsOverBound += km.over
	}
	if math.IsInf(s.BoundRatioMax, -1) {
		s.BoundRatioMax = 0
	}
	s.BoundRatioMax = round4(s.BoundRatioMax)
	if m.utilDen > 0 {
		u := round4(m.utilNum / m.utilDen * 100)
		s.UtilizationPct = &u
	}
	t, a := m.fairT, m.fairA
	if sum(t) == 0 {
		t, a = m.fairTAll, m.fairAAll
	}
	s.JainFairness = round4(jain(t, a))
	s.ServedPct = make(map[string]float64, len(t))
	s.LeastServedPct = math.Inf(1)
	for r := range t {
		if t[r] > 0 {
			x := round4(a[r] / t[r] * 100)
			s.ServedPct[sc.Regions[r]] = x
			s.LeastServedPct = min(s.LeastServedPct, x)
		}
	}
	if math.IsInf(s.LeastServedPct, 1) {
		s.LeastServedPct = 100
	}
	if w.alg == Escrow {
		var worst float64
		for _, p := range m.phases {
			took := p.took
			if !p.done {
				took = p.end - p.start
				s.UnconvergedChanges++
			}
			worst = max(worst, float64(took)/1e9)
		}
		if len(m.phases) > 0 {
			worst = round3(worst)
			s.ConvergenceS = &worst
		}
	}
	secs := sc.Duration.Seconds()
	s.NatsMsgsPerS = round4(float64(w.natsMsgs) / secs)
	s.NatsBytesPerS = round4(float64(w.natsBytes) / secs)
	stats := append([]agent.Stats(nil), w.dead...)
	for _, r := range w.rs {
		for _, a := range r.agents {
			stats = append(stats, a.d.Stats())
		}
	}
	var ops, synced, granted, dropped int64
	paths := map[string]int64{}
	var byCause StoreOps
	for _, r := range w.rs {
		// Counted where the store is called: a lease item the service
		// answers from its memory of dry keys costs the store nothing.
		g, ret := r.svc.StoreItems()
		ops += g + ret
		byCause.Grant += g
		byCause.Return += ret
		byCause.Probe += r.svc.Probes()
	}
	for _, x := range stats {
		synced += int64(x.SyncDecisions)
		granted += x.TokensGranted
		dropped += x.TokensDropped
		for p := range x.Decisions {
			for o, n := range x.Decisions[p] {
				if n > 0 {
					paths[agent.Path(p).String()+[]string{"_denied", "_allowed"}[o]] += int64(n)
				}
			}
		}
		s.Requests += int64(x.Total())
	}
	if w.alg == Ideal {
		ops = w.idealOps
		s.Requests = w.idealOps
	} else {
		s.Requests += w.proxyPaths(paths)
		s.RLQS = w.proxySummary()
		s.Paths = paths
		ops += w.shareWrites
		byCause.ShareWrite = w.shareWrites
		s.StoreOps = &byCause
	}
	if m.admittedReqs > 0 {
		s.StoreOpsPerAdmitted = round4(float64(ops) / float64(m.admittedReqs))
	}
	if s.Requests > 0 {
		s.SyncDecisionPct = round4(float64(synced) / float64(s.Requests) * 100)
	}
	if granted > 0 {
		s.DroppedPct = round4(float64(dropped) / float64(granted) * 100)
	}
	var limit float64
	for _, k := range w.keys {
		limit += k.rate
	}
	return &Result{Summary: s, Series: m.series, Regions: sc.Regions, limit: limit}
}

func sum64(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

func sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

// jain is Jain's index of admitted[r] / target[r] over the regions with a
// target: 1 when every region got the same fraction of its fair share.
func jain(target, admitted []float64) float64 {
	var s, s2 float64
	n := 0
	for r := range target {
		if target[r] <= 0 {
			continue
		}
		x := admitted[r] / target[r]
		s += x
		s2 += x * x
		n++
	}
	if n == 0 || s2 == 0 {
		return 1
	}
	return s * s / (float64(n) * s2)
}

// WriteTable prints summaries side by side, one column per run.
func WriteTable(out io.Writer, sums []Summary) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, f func(s *Summary) string) {
		cells := []string{name}
		for i := range sums {
			cells = append(cells, f(&sums[i]))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	row("", func(s *Summary) string { return string(s.Algorithm) })
	row("admitted / demanded", func(s *Summary) string { return pct(float64(s.Admitted), float64(s.Demanded)) })
	for i, name := range []string{"1s", "10s", "60s"} {
		row("overshoot "+name, func(s *Summary) string { return optPct(s.OvershootPct.Get(i)) })
	}
	row("excess over ideal 10s", func(s *Summary) string { return optPct(s.ExcessOverIdealPct.S10) })
	row("bound ratio max", func(s *Summary) string { return fmt.Sprintf("%.3f", s.BoundRatioMax) })
	row("windows over bound", func(s *Summary) string { return fmt.Sprint(s.WindowsOverBound) })
	if slices.ContainsFunc(sums, func(s Summary) bool { return s.WindowBound != nil }) {
		win := func(f func(b *WindowBound) string) func(s *Summary) string {
			return func(s *Summary) string {
				if s.WindowBound == nil {
					return "-"
				}
				return f(s.WindowBound)
			}
		}
		row("fixed windows checked", win(func(b *WindowBound) string { return fmt.Sprint(b.Windows) }))
		row("window admitted max", win(func(b *WindowBound) string { return fmt.Sprintf("%.2f%%", b.AdmittedMaxPct) }))
		row("window bound ratio max", win(func(b *WindowBound) string { return fmt.Sprintf("%.3f", b.RatioMax) }))
		row("windows over window bound", win(func(b *WindowBound) string { return fmt.Sprint(b.WindowsOver) }))
	}
	if slices.ContainsFunc(sums, func(s Summary) bool { return s.RLQS != nil }) {
		px := func(f func(r *RLQSSummary) float64) func(s *Summary) string {
			return func(s *Summary) string {
				if s.RLQS == nil {
					return "-"
				}
				return fmt.Sprintf("%.3f", f(s.RLQS))
			}
		}
		row("rlqs Σ max_tokens / term", px(func(r *RLQSSummary) float64 { return r.MaxTokensRatioMax }))
		row("rlqs Σ tokens_per_fill / L", px(func(r *RLQSSummary) float64 { return r.TokensPerFillRatioMax }))
	}
	row("utilization", func(s *Summary) string { return optPct(s.UtilizationPct) })
	row("admitted vs ideal", func(s *Summary) string { return optPct(s.VersusIdealPct) })
	row("Jain fairness", func(s *Summary) string { return fmt.Sprintf("%.4f", s.JainFairness) })
	row("least served region", func(s *Summary) string { return fmt.Sprintf("%.2f%%", s.LeastServedPct) })
	row("convergence", func(s *Summary) string { return optSec(s.ConvergenceS, s.UnconvergedChanges) })
	row("NATS msgs/s", func(s *Summary) string { return fmt.Sprintf("%.1f", s.NatsMsgsPerS) })
	row("NATS bytes/s", func(s *Summary) string { return fmt.Sprintf("%.0f", s.NatsBytesPerS) })
	row("store ops / admitted", func(s *Summary) string { return fmt.Sprintf("%.4f", s.StoreOpsPerAdmitted) })
	row("sync decisions", func(s *Summary) string { return fmt.Sprintf("%.3f%%", s.SyncDecisionPct) })
	row("wall", func(s *Summary) string { return fmt.Sprintf("%.1fs", s.WallSeconds) })
	return tw.Flush()
}

func pct(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", a/b*100)
}

func optPct(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", *p)
}

func optSec(p *float64, unconverged int) string {
	if p == nil {
		return "-"
	}
	if unconverged > 0 {
		return fmt.Sprintf("%.1fs (%d never)", *p, unconverged)
	}
	return fmt.Sprintf("%.1fs", *p)
}
