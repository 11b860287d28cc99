package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/lease/agent"
)

// stopGrace is how long a child has after SIGTERM before it is killed:
// more than regiond's own -grace (10s) for in-flight calls.
const stopGrace = 15 * time.Second

// deployment is everything the run started, for stop to undo.
type deployment struct {
	nats    *server.Server
	targets []*target
	hc      *http.Client
	dir     string
}

// startDeployment starts NATS in-process, a redis-server and a regiond per
// region, and the agents. On error, what was started is in d for stop.
func startDeployment(ctx context.Context, o options, dir string) (*deployment, error) {
	d := &deployment{hc: &http.Client{Timeout: 5 * time.Second}, dir: dir}
	bin := o.regiond
	switch {
	case o.profiles != "":
		var err error
		if bin, err = buildRegiondPprof(ctx, dir); err != nil {
			return d, err
		}
	case bin == "":
		var err error
		if bin, err = buildRegiond(ctx, dir); err != nil {
			return d, err
		}
	}
	// The embedded server runs here rather than in a regiond
	// (-nats-embedded) so that its Varz and Connz are at hand.
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		return d, fmt.Errorf("nats: %w", err)
	}
	ns.Start()
	d.nats = ns
	if !ns.ReadyForConnections(readyTimeout) {
		return d, fmt.Errorf("nats: not accepting connections within %v", readyTimeout)
	}
	policy, err := policyFile(dir)
	if err != nil {
		return d, err
	}
	for _, r := range regions {
		t := &target{name: r}
		d.targets = append(d.targets, t)
		var addr string
		if t.redis, addr, err = startRedis(ctx, dir, "redis-"+r); err != nil {
			return d, err
		}
		t.rc = redis.NewClient(&redis.Options{Addr: addr})
		if t.daemon, err = startRegiond(ctx, dir, bin, regionArgs(o, r, addr, ns.ClientURL(), policy), r, o.profiles != ""); err != nil {
			return d, err
		}
	}
	for _, t := range d.targets {
		if err := t.daemon.waitReady(ctx); err != nil {
			return d, err
		}
	}
	for _, t := range d.targets {
		if err := startAgents(ctx, o, t); err != nil {
			return d, err
		}
	}
	return d, nil
}

// startAgents starts o.agents agents on t's regiond and waits for their
// policy. They hold a key a sweep and a half, so that every active key is
// held between two visits.
func startAgents(ctx context.Context, o options, t *target) error {
	for i := range o.agents {
		a, err := agent.New(agent.Config{
			Target:           t.daemon.lease,
			AgentID:          fmt.Sprintf("ration-scale-%s-%d", t.name, i),
			RoundTripTimeout: o.rttWait,
			IdleAfter:        o.load.sweep * 3 / 2,
			Logger:           quietLogger(),
		})
		if err != nil {
			return fmt.Errorf("agent %d in %s: %w", i, t.name, err)
		}
		t.agents = append(t.agents, a)
		wctx, cancel := context.WithTimeout(ctx, readyTimeout)
		err = a.WaitPolicy(wctx)
		cancel()
		if err != nil {
			return fmt.Errorf("agent %d in %s: policy: %w", i, t.name, err)
		}
	}
	return nil
}

// stop closes the agents, stops every regiond and then every
// redis-server (SIGTERM, SIGKILL after stopGrace) and shuts NATS down.
// With verbose it copies regiond's log to w first.
func (d *deployment) stop(w io.Writer, verbose bool) {
	for _, t := range d.targets {
		for _, a := range t.agents {
			_ = a.Close()
		}
	}
	for _, t := range d.targets {
		if t.daemon != nil {
			t.daemon.stop(stopGrace)
			if verbose {
				b, _ := os.ReadFile(t.daemon.errPath)
				fmt.Fprintf(w, "--- regiond %s log\n%s", t.name, b)
			}
		}
	}
	for _, t := range d.targets {
		if t.rc != nil {
			_ = t.rc.Close()
		}
		if t.redis != nil {
			t.redis.stop(stopGrace)
		}
	}
	d.hc.CloseIdleConnections()
	if d.nats != nil {
		d.nats.Shutdown()
		d.nats.WaitForShutdown()
	}
}

// startLine is what the run prints before the first interval.
type startLine struct {
	Kind      string         `json:"kind"` // "start"
	Keys      int            `json:"keys"`
	Sweep     string         `json:"sweep"`
	SweepRate float64        `json:"sweep_decisions_per_s"`
	Hot       float64        `json:"hot_decisions_per_s"`
	Move      float64        `json:"move"`
	Zipf      float64        `json:"zipf"`
	Agents    int            `json:"agents_per_region"`
	Layout    string         `json:"redis_layout"`
	Groups    int            `json:"redis_groups,omitempty"`
	Seed      uint64         `json:"seed"`
	NATS      string         `json:"nats"`
	PIDs      map[string]int `json:"pids"`
	Dir       string         `json:"dir"`
}

func (p printer) start(o options, d *deployment) {
	l := startLine{
		Kind: "start", Keys: o.load.keys, Sweep: o.load.sweep.String(), SweepRate: o.load.sweepRate(),
		Hot: o.load.hot, Move: o.load.move, Zipf: o.load.zipfS, Agents: o.agents, Layout: o.layout, Groups: o.groups, Seed: o.load.seed,
		NATS: d.nats.ClientURL(), PIDs: map[string]int{}, Dir: d.dir,
	}
	for _, t := range d.targets {
		l.PIDs["regiond-"+t.name] = t.daemon.pid()
		l.PIDs["redis-"+t.name] = t.redis.pid()
	}
	if p.json {
		_ = json.NewEncoder(p.w).Encode(l)
		return
	}
	layout := "keys (a Redis key a key)"
	if o.layout == "groups" {
		layout = fmt.Sprintf("groups (%d hashes)", o.groups)
	}
	fmt.Fprintf(p.w, "ration-scale: regions %v, each a regiond on its own redis-server (layout %s), exchanging every %v over NATS %s (in this process)\n",
		regions, layout, o.syncPeriod, l.NATS)
	for _, t := range d.targets {
		fmt.Fprintf(p.w, "  %s: regiond pid %d (lease %s, admin %s), redis-server pid %d\n",
			t.name, t.daemon.pid(), t.daemon.lease, t.daemon.admin, t.redis.pid())
	}
	first := ""
	if o.load.first != o.load.sweep {
		first = fmt.Sprintf(" (the first pass in %v: %.0f/s)", o.load.first, float64(l.Keys)/o.load.first.Seconds())
	}
	fmt.Fprintf(p.w, "load: %d keys, each decided once per %v (%.0f/s)%s in its home region (%.0f%% of keys move home every sweep),\n"+
		"  plus %.0f/s Zipf(s=%.2f) split 60/30/10%% between regions; %d agents per region; rule per-user 100/min global; seed %d\n",
		l.Keys, o.load.sweep, l.SweepRate, first, 100*l.Move, l.Hot, l.Zipf, l.Agents, l.Seed)
	fmt.Fprintf(p.w, "active keys: distinct keys the sweep decided within the regions' idle time (-idle-after %v); sweep lag: keys it is behind its schedule\n", o.idle)
	fmt.Fprintf(p.w, "load = the machine's one-minute load average; columns: rss, cpu/s and heap (go_memstats_heap_inuse_bytes) of regiond; epoch = mean exchange epoch;\n"+
		"  items/s = keys leased (one store operation each); l-err, x-err = failed store calls of the lease service and of the exchange in the interval,\n"+
		"  x-save = of them the persisted state's saves; share/s = shares the exchange wrote (or tried to);\n"+
		"  defer/s = share writes it left for a later epoch (past the epoch's budget, or after a failed call);\n"+
		"  state-w/s = persisted state written; redis = INFO used_memory;\n"+
		"  entries = the keys' entries in Redis (a Redis key each, or a field of a group hash: SCAN and HLEN, expired fields until swept),\n"+
		"  B/entry = their bytes each (used_memory − before the load − the state's); xrecs = the exchange's persisted records (its head's count),\n"+
		"  B/xrec = MEMORY USAGE of the state's hashes over them; ht = group hashes / state groups kept as hash tables, not listpacks; B/key = (used_memory − before the load)/max(entries, xrecs),\n"+
		"  everything ration keeps in that Redis per key; B/active key in all = Σ(used_memory − before)/active keys; rcpu/s = redis-server CPU;\n"+
		"  nats = regiond's connection, bytes published (in) and delivered (out); agent keys held; adm/den/fail = decisions, fail = by failure mode\n\n")
}
