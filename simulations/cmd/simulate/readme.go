package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ration-dev/ration/simulations/sim"
)

const (
	tableBegin = "<!-- table:begin -->"
	tableEnd   = "<!-- table:end -->"
)

// runReadme runs every scenario with every algorithm and rewrites the
// results table of a README between its markers.
func runReadme(readme string, files []string, stdout, stderr io.Writer, bar bool) int {
	if len(files) == 0 {
		fmt.Fprintln(stderr, "simulate: -readme needs scenario files as arguments")
		return exitUsage
	}
	doc, err := os.ReadFile(readme)
	if err != nil {
		fmt.Fprintln(stderr, "simulate:", err)
		return exitFailure
	}
	b, rest, ok1 := bytes.Cut(doc, []byte(tableBegin))
	_, e, ok2 := bytes.Cut(rest, []byte(tableEnd))
	if !ok1 || !ok2 {
		fmt.Fprintf(stderr, "simulate: %s has no %s ... %s markers\n", readme, tableBegin, tableEnd)
		return exitUsage
	}
	var scs []*sim.Scenario
	for _, f := range files {
		sc, err := sim.LoadFile(f)
		if err != nil {
			fmt.Fprintln(stderr, err)
			if errors.Is(err, sim.ErrInvalid) {
				return exitUsage
			}
			return exitFailure
		}
		scs = append(scs, sc)
	}
	var t strings.Builder
	t.WriteString("\n| scenario | algorithm | admitted / demanded | overshoot 1s | overshoot 10s | excess over ideal 10s | bound ratio max | utilization | vs ideal | Jain | least served | convergence | NATS msgs/s | NATS bytes/s | store ops / admitted | sync decisions | wall |\n")
	t.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	code := exitOK
	for _, sc := range scs {
		for _, a := range sim.Algorithms {
			res, err := runOne(sc, a, stderr, bar)
			if err != nil {
				fmt.Fprintf(stderr, "simulate: %s %s: %v\n", sc.Name, a, err)
				return exitFailure
			}
			s := &res.Summary
			if s.BoundBroken() {
				code = exitBound
			}
			conv := "-"
			if s.ConvergenceS != nil {
				conv = fmt.Sprintf("%.1f s", *s.ConvergenceS)
				if s.UnconvergedChanges > 0 {
					conv += fmt.Sprintf(" (%d never)", s.UnconvergedChanges)
				}
			}
			util := "-"
			if s.UtilizationPct != nil {
				util = fmt.Sprintf("%.2f%%", *s.UtilizationPct)
			}
			fmt.Fprintf(&t, "| %s | %s | %.2f%% | %s | %s | %s | %.3f | %s | %s | %.4f | %.2f%% | %s | %.1f | %.0f | %.4f | %.3f%% | %.1f s |\n",
				sc.Name, a, float64(s.Admitted)/float64(max(s.Demanded, 1))*100,
				pctOf(s.OvershootPct.S1), pctOf(s.OvershootPct.S10), pctOf(s.ExcessOverIdealPct.S10),
				worstRatio(s), util, pctOf(s.VersusIdealPct), s.JainFairness, s.LeastServedPct, conv, s.NatsMsgsPerS, s.NatsBytesPerS,
				s.StoreOpsPerAdmitted, s.SyncDecisionPct, s.WallSeconds)
			fmt.Fprintf(stdout, "%s %s: bound ratio %.3f, %.1f s\n", sc.Name, a, worstRatio(s), s.WallSeconds)
		}
	}
	var nd bytes.Buffer
	nd.Write(b)
	nd.WriteString(tableBegin)
	nd.WriteString(t.String())
	nd.WriteString(tableEnd)
	nd.Write(e)
	if err := os.WriteFile(readme, nd.Bytes(), 0o644); err != nil {
		fmt.Fprintln(stderr, "simulate:", err)
		return exitFailure
	}
	return code
}

// worstRatio is the worst bound ratio of a run: its token buckets' sliding
// windows' (L·W + B) or its fixed windows' (limit + terms).
func worstRatio(s *sim.Summary) float64 {
	if s.WindowBound != nil {
		return max(s.BoundRatioMax, s.WindowBound.RatioMax)
	}
	return s.BoundRatioMax
}

func pctOf(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", *p)
}
