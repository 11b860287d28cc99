// Command ration-local runs a three-region ration deployment on one machine
// and shows the coordinator at work: three regiond daemons (us, eu, ap) on
// memory stores, exchanging over an embedded NATS server, each serving a
// real agent that a built-in load generator drives. Demand leans on one
// region and then moves to the next; every second a table shows each
// region's demand during that second, its share of the quota and the
// tokens admitted and denied, and the total beside the limit.
//
//	go run ./cmd/ration-local
//
// Ctrl-C stops everything cleanly; -duration makes it stop by itself.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/ration-dev/ration/internal/regiond"
	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/kvstore"
	"github.com/ration-dev/ration/sync/embedded"
)

var regions = []string{"us", "eu", "ap"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ration-local:", err)
		os.Exit(1)
	}
}

type options struct {
	duration, period, shift time.Duration
	limit                   int64
	verbose                 bool
}

func parse(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("ration-local", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (0: run until Ctrl-C)")
	fs.Int64Var(&o.limit, "limit", 1000, "the demo rule's global limit in tokens per second (burst the same)")
	fs.DurationVar(&o.period, "sync-period", time.Second, "how often the regions exchange reports and move shares")
	fs.DurationVar(&o.shift, "shift", 10*time.Second, "how long demand leans on one region before it moves to the next")
	fs.BoolVar(&o.verbose, "v", false, "log what the daemons do")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.limit < 10:
		return o, fmt.Errorf("-limit %d: want at least 10 tokens/s", o.limit)
	case o.period < 10*time.Millisecond:
		return o, fmt.Errorf("-sync-period %v: want at least 10ms", o.period)
	case o.shift <= 0 || o.duration < 0:
		return o, errors.New("-shift must be positive and -duration not negative")
	}
	return o, nil
}

// run starts the deployment, drives it and prints to stdout until ctx is
// done or the duration has passed, then stops everything it started.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if o.verbose {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}

	nats, err := embedded.Start(embedded.Config{JetStream: true})
	if err != nil {
		return err
	}
	defer nats.Close()

	// Every region enforces the one policy of the policy store, which
	// ration policy push (-nats the URL printed below) changes.
	pol := fmt.Sprintf("rules:\n  - name: demo\n    key: [tenant]\n    limit: %d\n    period: 1s\n    burst: %d\n", o.limit, o.limit)
	rev, err := pushPolicy(ctx, nats.ClientURL(), []byte(pol), logger)
	if err != nil {
		return err
	}
	daemons := map[string]*regiond.Daemon{}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, d := range daemons {
			_ = d.Shutdown(sctx)
		}
	}()
	for _, r := range regions {
		d, err := regiond.New(regiond.Config{
			Region:     r,
			Regions:    regions,
			Replica:    r + "-0",
			Listen:     "127.0.0.1:0",
			Admin:      "-",
			PolicyFile: "nats-kv://" + kvstore.DefaultBucket,
			NATSURL:    nats.ClientURL(),
			SyncPeriod: o.period,
			Logger:     logger.With("region", r),
		})
		if err != nil {
			return err
		}
		if err := d.Start(ctx); err != nil {
			return err
		}
		daemons[r] = d
	}

	agents := map[string]*agent.Agent{}
	defer func() {
		for _, a := range agents {
			_ = a.Close()
		}
	}()
	for _, r := range regions {
		a, err := agent.New(agent.Config{Target: daemons[r].LeaseAddr(), AgentID: "ration-local-" + r, Logger: logger})
		if err != nil {
			return err
		}
		agents[r] = a
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = a.WaitPolicy(wctx)
		cancel()
		if err != nil {
			return fmt.Errorf("agent in %s: %w", r, err)
		}
	}

	fmt.Fprintf(stdout, "ration-local: regions %v, each a regiond on a memory store, exchanging every %v over embedded NATS %s\n",
		regions, o.period, nats.ClientURL())
	fmt.Fprintf(stdout, "rule demo: %d tokens/s (burst %d) for tenant=acme, shared by all regions; demand moves every %v\n",
		o.limit, o.limit, o.shift)
	fmt.Fprintf(stdout, "policy: revision %d of the policy store (go run ./cmd/ration policy history -nats %s)\n\n", rev, nats.ClientURL())

	start := time.Now()
	g := &generator{limit: o.limit, shift: o.shift, start: start}
	var wg sync.WaitGroup
	lctx, stopLoad := context.WithCancel(ctx)
	for i, r := range regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.drive(lctx, i, agents[r])
		}()
	}
	defer func() { stopLoad(); wg.Wait() }()

	key := policy.StoreKey("demo", "tenant=acme")
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	prev := start
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(stdout, "stopping")
			return nil
		case now := <-tick.C:
			g.print(ctx, stdout, prev, now, daemons, key)
			prev = now
		}
	}
}

// generator drives demand: the hot region asks for 90% of the limit, the
// next one 20% and the last 10%, so the quota is oversubscribed by 20%;
// every shift the hot region moves on.
type generator struct {
	limit int64
	shift time.Duration
	start time.Time
	// per region: tokens admitted and denied since the last print
	admitted, denied [3]atomic.Int64
}

// rate returns region i's demand in tokens/s at elapsed time since start.
func (g *generator) rate(i int, elapsed time.Duration) int64 {
	hot := int(elapsed/g.shift) % len(regions)
	switch (i - hot + len(regions)) % len(regions) {
	case 0:
		return g.limit * 9 / 10
	case 1:
		return g.limit * 2 / 10
	}
	return g.limit / 10
}

// drive sends region i's requests through its agent in 5ms steps.
func (g *generator) drive(ctx context.Context, i int, a *agent.Agent) {
	ds := []policy.Descriptor{{Key: "tenant", Value: "acme"}}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	last := time.Now()
	var owed float64
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			owed += float64(g.rate(i, now.Sub(g.start))) * now.Sub(last).Seconds()
			last = now
			for ; owed >= 1; owed-- {
				if a.Allow(ctx, ds, 1).Allowed {
					g.admitted[i].Add(1)
				} else {
					g.denied[i].Add(1)
				}
			}
		}
	}
}

// demandDuring is region i's demand over the interval from..to: the rate
// in force at its middle, so that a second that ends just after the
// demand moved is labelled with the demand it answered, not the new one.
func (g *generator) demandDuring(i int, from, to time.Time) int64 {
	return g.rate(i, from.Sub(g.start)+to.Sub(from)/2)
}

// print writes one table: each region's demand, share, admitted and denied
// tokens over the interval from..to (a second).
func (g *generator) print(ctx context.Context, w io.Writer, from, to time.Time, daemons map[string]*regiond.Daemon, key string) {
	var sec second
	sec.elapsed = to.Sub(g.start)
	sec.limit = g.limit
	for i, r := range regions {
		sec.demand[i] = g.demandDuring(i, from, to)
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		ppm, err := daemons[r].Share(sctx, key)
		cancel()
		sec.share[i] = -1
		if err == nil {
			sec.share[i] = float64(ppm) / 1e6
		}
		sec.admitted[i], sec.denied[i] = g.admitted[i].Swap(0), g.denied[i].Swap(0)
	}
	sec.write(w)
}

// second is one second's figures: per region its demand during the
// second, its share at the end of it (negative: unknown), and the tokens
// admitted and denied during it.
type second struct {
	elapsed          time.Duration
	limit            int64
	demand           [3]int64
	share            [3]float64
	admitted, denied [3]int64
}

// write prints the second's table, its total beside the limit.
func (s second) write(w io.Writer) {
	fmt.Fprintf(w, "t=%-4v demand/s:", s.elapsed.Round(time.Second))
	for i, r := range regions {
		fmt.Fprintf(w, " %s %d", r, s.demand[i])
	}
	fmt.Fprintf(w, "\n  %-6s %7s %9s %7s\n", "region", "share", "admitted", "denied")
	var share float64
	var adm, den int64
	for i, r := range regions {
		sh := "?"
		if s.share[i] >= 0 {
			sh = fmt.Sprintf("%.1f%%", s.share[i]*100)
			share += s.share[i] * 100
		}
		adm, den = adm+s.admitted[i], den+s.denied[i]
		fmt.Fprintf(w, "  %-6s %7s %9d %7d\n", r, sh, s.admitted[i], s.denied[i])
	}
	fmt.Fprintf(w, "  %-6s %6.1f%% %9d %7d  (limit %d/s)\n\n", "total", share, adm, den, s.limit)
}

// pushPolicy writes the demo's policy to the policy store of the embedded
// NATS at url, and returns its revision.
func pushPolicy(ctx context.Context, url string, doc []byte, logger *slog.Logger) (uint64, error) {
	nc, err := natsgo.Connect(url)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := kvstore.Open(ctx, kvstore.Config{Conn: nc, Logger: logger})
	if err != nil {
		return 0, fmt.Errorf("policy store: %w", err)
	}
	r, err := st.Push(ctx, doc, kvstore.Meta{Author: "ration-local", Message: "the demo's policy"})
	if err != nil {
		return 0, fmt.Errorf("policy store: %w", err)
	}
	return r.Revision, nil
}
