// Command simulate runs a ration scenario in the regional skew simulator
// and checks every window of admitted traffic against the bound.
//
//	go run ./simulations/cmd/simulate -scenario FILE [-seed N] [-out DIR] [-algorithm escrow|static|ideal|all]
//
// It prints a summary table (one column per algorithm) and writes to DIR
// (default sim-out/<scenario name>; DIR/<algorithm> for several
// algorithms) summary.json, series.csv and admitted.png, shares.png and
// bound.png. A progress bar is drawn on a terminal when a run takes more
// than a moment.
//
// With -readme FILE and scenario files as arguments, it runs every scenario
// with every algorithm and rewrites the table between the markers
// "<!-- table:begin -->" and "<!-- table:end -->" in FILE.
//
// Exit status: 0 when every window is within the bound, 1 when a window
// exceeds it (a sliding window of a token bucket, or a fixed window), 2 for a bad scenario or bad flags (the scenario's errors name
// file, line and field), 3 when the run or writing its outputs failed.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/ration-dev/ration/simulations/sim"
)

func main() {
	// A run allocates much that dies young and keeps little (tens of MiB):
	// collecting less often makes it faster and stays far below 1 GiB.
	// GOGC in the environment still wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const (
	exitOK      = 0
	exitBound   = 1
	exitUsage   = 2
	exitFailure = 3
)

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scenario := fs.String("scenario", "", "scenario YAML `file` (required unless -readme)")
	seed := fs.String("seed", "", "seed overriding the scenario's (an unsigned integer)")
	out := fs.String("out", "", "output `dir` (default sim-out/<scenario name>)")
	algo := fs.String("algorithm", "escrow", "escrow, static, ideal, a comma-separated list, or all")
	duration := fs.Duration("duration", 0, "simulated time overriding the scenario's (demand and faults keep their times)")
	readme := fs.String("readme", "", "run the scenario files given as arguments with every algorithm and rewrite the table in this `file`")
	quiet := fs.Bool("quiet", false, "no progress bar")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile to `file`")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(stderr, "simulate:", err)
			return exitUsage
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "simulate:", err)
			return exitFailure
		}
		defer pprof.StopCPUProfile()
	}
	algs, err := parseAlgorithms(*algo)
	if err != nil {
		fmt.Fprintln(stderr, "simulate:", err)
		return exitUsage
	}
	if *readme != "" {
		return runReadme(*readme, fs.Args(), stdout, stderr, !*quiet)
	}
	if *scenario == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "simulate: -scenario FILE is required (and takes no other arguments)")
		fs.Usage()
		return exitUsage
	}
	sc, err := sim.LoadFile(*scenario)
	if err != nil {
		fmt.Fprintln(stderr, err)
		if errors.Is(err, sim.ErrInvalid) {
			return exitUsage
		}
		return exitFailure
	}
	if *seed != "" {
		n, err := strconv.ParseUint(*seed, 10, 64)
		if err != nil {
			fmt.Fprintf(stderr, "simulate: -seed %q: want an unsigned integer\n", *seed)
			return exitUsage
		}
		sc.Seed = n
	}
	if *duration > 0 {
		if *duration%sc.Step != 0 {
			fmt.Fprintf(stderr, "simulate: -duration %v is not a multiple of the scenario's step %v\n", *duration, sc.Step)
			return exitUsage
		}
		sc.Duration = *duration
	}
	dir := *out
	if dir == "" {
		dir = filepath.Join("sim-out", sc.Name)
	}
	var sums []sim.Summary
	code := exitOK
	for _, a := range algs {
		res, err := runOne(sc, a, stderr, !*quiet)
		if err != nil {
			fmt.Fprintln(stderr, "simulate:", err)
			return exitFailure
		}
		d := dir
		if len(algs) > 1 {
			d = filepath.Join(dir, string(a))
		}
		if err := sim.WriteFiles(d, res); err != nil {
			fmt.Fprintln(stderr, "simulate:", err)
			return exitFailure
		}
		sums = append(sums, res.Summary)
		if res.Summary.BoundBroken() {
			code = exitBound
		}
	}
	fmt.Fprintf(stdout, "%s, seed %d, %v simulated; outputs in %s\n", sc.Name, sc.Seed, sc.Duration, dir)
	if err := sim.WriteTable(stdout, sums); err != nil {
		return exitFailure
	}
	for _, s := range sums {
		if s.BoundRatioMax > 1 || s.WindowsOverBound > 0 {
			fmt.Fprintf(stdout, "BOUND EXCEEDED: %s: %d windows above L·W + B (worst ratio %.3f)\n", s.Algorithm, s.WindowsOverBound, s.BoundRatioMax)
		}
		if b := s.WindowBound; b != nil && (b.RatioMax > 1 || b.WindowsOver > 0) {
			fmt.Fprintf(stdout, "BOUND EXCEEDED: %s: %d fixed windows above limit + their terms (worst ratio %.3f)\n", s.Algorithm, b.WindowsOver, b.RatioMax)
		}
	}
	return code
}

func parseAlgorithms(s string) ([]sim.Algorithm, error) {
	if s == "all" {
		return sim.Algorithms, nil
	}
	var out []sim.Algorithm
	for _, a := range strings.Split(s, ",") {
		switch alg := sim.Algorithm(strings.TrimSpace(a)); alg {
		case sim.Escrow, sim.Static, sim.Ideal:
			out = append(out, alg)
		default:
			return nil, fmt.Errorf("-algorithm %q: want escrow, static, ideal, a list of them, or all", a)
		}
	}
	return out, nil
}

// runOne runs one algorithm, drawing a progress bar on stderr when it is a
// terminal and the run lasts more than a second and a half.
func runOne(sc *sim.Scenario, a sim.Algorithm, stderr io.Writer, bar bool) (*sim.Result, error) {
	opt := sim.Options{Algorithm: a}
	var p *progress
	if bar && isTerminal(stderr) {
		p = &progress{w: stderr, start: time.Now(), label: fmt.Sprintf("%s %s", sc.Name, a)}
		opt.Progress = p.update
	}
	res, err := sim.Run(sc, opt)
	if p != nil {
		p.clear()
	}
	return res, err
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

type progress struct {
	w     io.Writer
	start time.Time
	label string
	drawn bool
}

func (p *progress) update(done, total time.Duration) {
	el := time.Since(p.start)
	if el < 1500*time.Millisecond || total <= 0 {
		return
	}
	frac := float64(done) / float64(total)
	const width = 30
	n := int(frac * width)
	eta := ""
	if frac > 0.01 {
		eta = " eta " + (time.Duration(float64(el)/frac) - el).Round(time.Second).String()
	}
	fmt.Fprintf(p.w, "\r%s [%s%s] %3.0f%% %v/%v%s   ", p.label, strings.Repeat("#", n), strings.Repeat(".", width-n),
		frac*100, done.Round(time.Second), total, eta)
	p.drawn = true
}

func (p *progress) clear() {
	if p.drawn {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", 100))
	}
}
