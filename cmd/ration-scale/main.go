// Command ration-scale is the scale run: three regiond processes, each on
// its own redis-server, exchanging over an embedded NATS server, with
// gateway agents in this process keeping -keys distinct keys active. Every
// -report it prints, per region, regiond's memory and CPU, Redis memory
// per key, NATS bytes per second and the decisions; and the agents' memory
// per key held. At the end a summary sets the first full interval beside
// the last, so that memory that stays flat (or grows) shows.
//
//	go run ./cmd/ration-scale                  # 1,000,000 keys for 10 minutes, a report every 30s
//	go run ./cmd/ration-scale -keys 10000 -duration 1m -report 10s
//	go run ./cmd/ration-scale -keys 100000 -duration 3m -heap-profiles /tmp/prof
//
// regiond runs in its grouped Redis layout (-redis-layout groups, the
// memory issue 12 asks for; keys for regiond's default), with
// -redis-groups sized from -keys. The keys' entries and the exchange's
// records are counted in Redis itself, in either layout.
//
// It needs redis-server on PATH and the Go toolchain (it builds regiond
// from this module). It is not part of the tests or CI: at a million keys
// it wants the whole machine for ten minutes. Ctrl-C stops every process
// it started and removes its temp dir.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/bits"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ration-dev/ration/lease/agent"
)

// regions of the run, in the order they are printed.
var regions = []string{"ap", "eu", "us"}

// regionIdle is the exchange's default IdleAfter (region.Config), the
// default of -idle-after: a key with no demand anywhere for this long
// retires. The sweep revisits every key within it, so every key stays
// active.
const regionIdle = 60 * time.Second

// policyYAML is the run's one rule: a per-user limit shared by all
// regions. Its bucket refills in a minute and so expires in Redis two
// minutes after its last use (2 × burst ÷ rate): with a sweep of more
// than that, a key's bucket is gone between two of its requests, as a
// full bucket needs no state.
const policyYAML = `rules:
  - name: per-user
    key: [user]
    limit: 100
    period: 1m
    burst: 100
    scope: global
    on_error: local
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ration-scale:", err)
		os.Exit(1)
	}
}

type options struct {
	load                loadConfig
	duration, report    time.Duration
	syncPeriod, rttWait time.Duration
	storeTimeout        time.Duration
	idle                time.Duration // regiond -idle-after
	agents              int
	json                bool
	regiond             string
	verbose             bool
	layout              string // regiond -redis-layout
	groups              int    // regiond -redis-groups, for layout groups
	profiles            string // directory for heap profiles at the end; "" none
}

func parse(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("ration-scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.IntVar(&o.load.keys, "keys", 1_000_000, "distinct keys kept active, each decided at least once per -sweep")
	fs.DurationVar(&o.duration, "duration", 10*time.Minute, "how long the load runs")
	fs.DurationVar(&o.report, "report", 30*time.Second, "how often the figures are printed")
	out := fs.String("o", "text", "output: text, or json (JSON lines)")
	fs.DurationVar(&o.load.sweep, "sweep", 50*time.Second, "how long one pass over every key takes; under -idle-after")
	fs.DurationVar(&o.load.first, "first-sweep", 0, "how long the first pass over every key takes, at most -sweep (0: -sweep): a million keys at a sweep the machine can drive take long to become active")
	fs.DurationVar(&o.idle, "idle-after", regionIdle, "regiond -idle-after: how long a key with no demand anywhere stays in the exchange; more than -sweep")
	fs.Float64Var(&o.load.hot, "hot", 1000, "Zipf-distributed decisions per second on top of the sweep, split 60/30/10% between the regions (rotating every sweep)")
	fs.Float64Var(&o.load.zipfS, "zipf", 1.1, "Zipf exponent of the hot traffic (> 1)")
	fs.Float64Var(&o.load.move, "move", 0.1, "share of keys whose home region moves on every sweep")
	fs.IntVar(&o.agents, "agents", 2, "agents per region")
	fs.IntVar(&o.load.workers, "workers", 8, "goroutines deciding per agent (bounds the concurrent cold round trips)")
	seed := fs.Uint64("seed", 0, "seed of the load (0: from the clock; printed)")
	fs.DurationVar(&o.syncPeriod, "sync-period", time.Second, "regiond -sync-period")
	fs.DurationVar(&o.storeTimeout, "store-timeout", 0, "regiond -store-timeout, the deadline of each Redis call (0: regiond's default, 50ms)")
	fs.DurationVar(&o.rttWait, "round-trip-timeout", 100*time.Millisecond, "agents' RoundTripTimeout: how long a cold key waits for its region before its failure mode decides")
	fs.StringVar(&o.regiond, "regiond", "", "regiond binary to run (default: go build ./cmd/regiond into the temp dir)")
	fs.StringVar(&o.layout, "redis-layout", "groups", "regiond -redis-layout: groups (a key a field of a hash, issue 12's memory) or keys (a Redis key a key, regiond's default)")
	fs.IntVar(&o.groups, "redis-groups", 0, "regiond -redis-groups, a power of two (0: sized from -keys, groupsFor)")
	fs.StringVar(&o.profiles, "heap-profiles", "", "at the end of the run, write each regiond's heap profile and this process's into this directory (regiond is built with net/http/pprof on a loopback port; needs the module source)")
	fs.BoolVar(&o.verbose, "v", false, "regiond logs at info (default warn), in the temp dir; printed at exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.load.seed = *seed
	if o.load.first == 0 {
		o.load.first = o.load.sweep
	}
	if o.load.seed == 0 {
		o.load.seed = uint64(time.Now().UnixNano())
	}
	o.json = *out == "json"
	if o.layout == "groups" && o.groups == 0 {
		o.groups = groupsFor(o.load.keys)
	}
	switch {
	case *out != "text" && *out != "json":
		return o, fmt.Errorf("-o %q: want text or json", *out)
	case o.load.keys < 1 || o.load.keys > math.MaxUint32:
		return o, fmt.Errorf("-keys %d: want 1 to %d", o.load.keys, uint32(math.MaxUint32))
	case o.duration <= 0 || o.report <= 0:
		return o, errors.New("-duration and -report must be positive")
	case o.load.sweep <= 0 || o.load.sweep >= o.idle:
		return o, fmt.Errorf("-sweep %v: want more than 0 and less than -idle-after %v", o.load.sweep, o.idle)
	case o.load.first < 0 || o.load.first > o.load.sweep:
		return o, fmt.Errorf("-first-sweep %v: want 0 (-sweep) to -sweep %v", o.load.first, o.load.sweep)
	case !(o.load.hot >= 0) || math.IsInf(o.load.hot, 0):
		return o, fmt.Errorf("-hot %v: want a finite rate ≥ 0", o.load.hot)
	case !(o.load.zipfS > 1) || math.IsInf(o.load.zipfS, 0):
		return o, fmt.Errorf("-zipf %v: want more than 1", o.load.zipfS)
	case !(o.load.move >= 0 && o.load.move <= 1):
		return o, fmt.Errorf("-move %v: want 0 to 1", o.load.move)
	case o.agents < 1 || o.load.workers < 1:
		return o, errors.New("-agents and -workers must be at least 1")
	case o.layout != "keys" && o.layout != "groups":
		return o, fmt.Errorf("-redis-layout %q: want keys or groups", o.layout)
	case o.groups != 0 && (o.layout != "groups" || o.groups < 1 || bits.OnesCount(uint(o.groups)) != 1):
		return o, fmt.Errorf("-redis-groups %d: want a power of two, with -redis-layout groups", o.groups)
	case o.profiles != "" && o.regiond != "":
		return o, errors.New("-heap-profiles builds regiond itself: not with -regiond")
	case o.syncPeriod < 10*time.Millisecond || o.rttWait <= 0 || o.storeTimeout < 0:
		return o, errors.New("-sync-period must be at least 10ms, -round-trip-timeout positive and -store-timeout not negative")
	}
	return o, nil
}

// run starts the deployment, drives it for the duration (or until ctx is
// done) while printing reports, and stops everything it started.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	dir, err := os.MkdirTemp("", "ration-scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	d, err := startDeployment(ctx, o, dir)
	// Stops what was started, also after an error half way.
	defer d.stop(stderr, o.verbose)
	if err != nil {
		return err
	}
	p := printer{w: stdout, json: o.json}
	p.start(o, d)

	s := &sampler{ns: d.nats, regions: d.targets, hc: d.hc, idle: o.idle}
	s.gen = newGenerator(o.load, d.agents())
	s.start = time.Now()
	s.gen.start = s.start
	if err := s.baseline(ctx); err != nil {
		return err
	}
	err = drive(ctx, o, s, p)
	if o.profiles != "" && err == nil {
		// After an interrupt too: the profiles are of the load as it
		// stood. ctx may be done, so the fetch has its own deadline.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		defer cancel()
		if err := d.writeProfiles(pctx, o.profiles); err != nil {
			return fmt.Errorf("heap profiles: %w", err)
		}
		fmt.Fprintf(stdout, "heap profiles in %s: go tool pprof -sample_index=inuse_space -top %s\n", o.profiles, filepath.Join(o.profiles, "regiond-eu.heap"))
	}
	return err
}

// drive runs the load and prints every interval, then the summary.
func drive(ctx context.Context, o options, s *sampler, p printer) error {
	lctx, stopLoad := context.WithCancel(ctx)
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		s.gen.run(lctx)
	}()
	defer func() { stopLoad(); <-loaded }()

	end := time.NewTimer(o.duration)
	defer end.Stop()
	t := time.NewTicker(o.report)
	defer t.Stop()
	var sum summary
	for {
		select {
		case <-ctx.Done():
			p.summary(sum)
			return nil
		case <-end.C:
			// The last interval ends with the run.
			if err := report(ctx, s, p, &sum, o.load.keys); err != nil {
				return err
			}
			p.summary(sum)
			return nil
		case <-t.C:
			if err := report(ctx, s, p, &sum, o.load.keys); err != nil {
				return err
			}
		}
	}
}

func report(ctx context.Context, s *sampler, p printer, sum *summary, keys int) error {
	if err := s.sample(ctx, time.Now()); err != nil {
		return err
	}
	p.interval(s)
	sum.keep(s, keys)
	return nil
}

// agents of every region, [region][agent].
func (d *deployment) agents() [][]*agent.Agent {
	var as [][]*agent.Agent
	for _, t := range d.targets {
		as = append(as, t.agents)
	}
	return as
}

// quietLogger discards, for the agents.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// policyFile writes the run's policy into dir.
func policyFile(dir string) (string, error) {
	path := filepath.Join(dir, "policy.yaml")
	return path, os.WriteFile(path, []byte(policyYAML), 0o644)
}

// keysPerGroup is what the groups layout is sized for: DESIGN's "Redis
// layouts (as built)" advises about 64 keys a hash, under the 128 fields
// up to which a packaged redis.conf keeps a hash a listpack.
const keysPerGroup = 64

// groupsFor is the power of two nearest keys/keysPerGroup (at least 1):
// every region's Redis may hold an entry for every key (a share the
// exchange writes), so the sizing takes all of them.
func groupsFor(keys int) int {
	want := float64(keys) / keysPerGroup
	g := 1
	for float64(g)*math.Sqrt2 < want {
		g *= 2
	}
	return g
}

// regionArgs are regiond's flags for region r.
func regionArgs(o options, r, redisAddr, natsURL, policy string) []string {
	level := "warn"
	if o.verbose {
		level = "info"
	}
	args := []string{
		"-region", r, "-regions", strings.Join(regions, ","), "-replica", r + "-0",
		"-redis", "redis://" + redisAddr, "-nats", natsURL,
		"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0",
		"-policy", policy, "-sync-period", o.syncPeriod.String(), "-log-level", level,
		"-idle-after", o.idle.String(),
	}
	if o.layout == "groups" {
		args = append(args, "-redis-layout", "groups", "-redis-groups", strconv.Itoa(o.groups))
	}
	if o.storeTimeout > 0 {
		args = append(args, "-store-timeout", o.storeTimeout.String())
	}
	return args
}
