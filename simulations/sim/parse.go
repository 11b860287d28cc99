package sim

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/policy"
)

// LoadFile reads and parses a scenario file.
func LoadFile(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes and validates a scenario, in the manner of the policy
// package: every problem is reported with its file, line and field, unknown
// fields are errors, and a bad document returns no Scenario. The error
// is an Errors, which wraps ErrInvalid.
func Parse(file string, data []byte) (*Scenario, error) {
	p := &parser{file: file}
	sc := p.document(data)
	if len(p.errs) > 0 {
		slices.SortStableFunc(p.errs, func(a, b *FieldError) int { return cmp.Compare(a.Line, b.Line) })
		return nil, p.errs
	}
	sc.File = file
	return sc, nil
}

type parser struct {
	file string
	errs Errors
}

func (p *parser) errorf(line int, field, format string, args ...any) {
	p.errs = append(p.errs, &FieldError{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// fields is a mapping's entries by name, checked against known names.
type fields struct {
	line int
	m    map[string][2]*yaml.Node // name → key, value
}

func (p *parser) mapping(n *yaml.Node, path string, known ...string) (fields, bool) {
	fs := fields{line: n.Line, m: map[string][2]*yaml.Node{}}
	if n.Kind != yaml.MappingNode {
		p.errorf(n.Line, path, "must be a mapping (got %s)", describe(n))
		return fs, false
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := k.Value
		fp := name
		if path != "" {
			fp = path + "." + name
		}
		switch {
		case k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str":
			p.errorf(k.Line, path, "keys must be strings (got %s)", describe(k))
		case !slices.Contains(known, name):
			p.errorf(k.Line, fp, "unknown field (known: %s)", strings.Join(known, ", "))
		case fs.m[name][0] != nil:
			p.errorf(k.Line, fp, "duplicate field (first at line %d)", fs.m[name][0].Line)
		case v.Kind == yaml.AliasNode:
			p.errorf(v.Line, fp, "aliases are not supported")
		default:
			fs.m[name] = [2]*yaml.Node{k, v}
		}
	}
	return fs, true
}

func (f fields) get(name string) (*yaml.Node, *yaml.Node, bool) {
	kv, ok := f.m[name]
	return kv[0], kv[1], ok
}

func (p *parser) str(path string, k, v *yaml.Node) (string, bool) {
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
		p.errorf(k.Line, path, "must be a string (got %s)", describe(v))
		return "", false
	}
	return v.Value, true
}

func (p *parser) number(path string, k, v *yaml.Node) (float64, bool) {
	if v.Kind == yaml.ScalarNode && (v.ShortTag() == "!!int" || v.ShortTag() == "!!float") {
		if x, err := strconv.ParseFloat(strings.ReplaceAll(v.Value, "_", ""), 64); err == nil && !math.IsInf(x, 0) && !math.IsNaN(x) {
			return x, true
		}
	}
	p.errorf(k.Line, path, "must be a number (got %s)", describe(v))
	return 0, false
}

func (p *parser) integer(path string, k, v *yaml.Node) (int64, bool) {
	var x int64
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!int" && v.Decode(&x) == nil {
		return x, true
	}
	p.errorf(k.Line, path, "must be an integer (got %s)", describe(v))
	return 0, false
}

func (p *parser) duration(path string, k, v *yaml.Node) (time.Duration, bool) {
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!int" && v.Value == "0" {
		return 0, true
	}
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" {
		if d, err := time.ParseDuration(v.Value); err == nil {
			if d < 0 {
				p.errorf(k.Line, path, "must not be negative")
				return 0, false
			}
			return d, true
		}
	}
	p.errorf(k.Line, path, `must be a Go duration such as "1s" or "500ms" (got %s)`, describe(v))
	return 0, false
}

func (p *parser) document(data []byte) *Scenario {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errorf(0, "", "document is empty")
		} else {
			p.errorf(0, "", "YAML syntax error: %s", strings.TrimPrefix(err.Error(), "yaml: "))
		}
		return nil
	}
	if len(doc.Content) == 0 {
		p.errorf(0, "", "document is empty")
		return nil
	}
	fs, ok := p.mapping(doc.Content[0], "", "name", "seed", "duration", "step", "grid", "sample", "regions",
		"agents_per_region", "sync_period", "lease_ttl", "lease_period", "network", "redis", "keys", "demand", "faults")
	if !ok {
		return nil
	}
	sc := &Scenario{
		Step: time.Millisecond, SyncPeriod: time.Second, LeaseTTL: 100 * time.Millisecond,
		LeasePeriod: 50 * time.Millisecond, AgentsPerRegion: 1,
		Network: Network{AgentRTT: time.Millisecond, AgentJitter: 200 * time.Microsecond},
		Redis:   Redis{Latency: 500 * time.Microsecond},
	}
	req := func(name string) (*yaml.Node, *yaml.Node, bool) {
		k, v, ok := fs.get(name)
		if !ok {
			p.errorf(fs.line, name, "is required")
		}
		return k, v, ok
	}
	if k, v, ok := req("name"); ok {
		sc.Name, _ = p.str("name", k, v)
	}
	if k, v, ok := fs.get("seed"); ok {
		// Seeds are unsigned 64-bit, as the command's -seed flag takes them.
		if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || v.Decode(&sc.Seed) != nil {
			p.errorf(k.Line, "seed", "must be an integer in [0, 2^64) (got %s)", describe(v))
		}
	}
	if k, v, ok := req("duration"); ok {
		if d, ok := p.duration("duration", k, v); ok {
			if d <= 0 {
				p.errorf(k.Line, "duration", "must be > 0")
			}
			sc.Duration = d
		}
	}
	durs := []struct {
		name string
		dst  *time.Duration
	}{{"step", &sc.Step}, {"grid", &sc.Grid}, {"sample", &sc.Sample}, {"sync_period", &sc.SyncPeriod},
		{"lease_ttl", &sc.LeaseTTL}, {"lease_period", &sc.LeasePeriod}}
	for _, d := range durs {
		if k, v, ok := fs.get(d.name); ok {
			if x, ok := p.duration(d.name, k, v); ok {
				if x <= 0 {
					p.errorf(k.Line, d.name, "must be > 0")
				} else {
					*d.dst = x
				}
			}
		}
	}
	if k, v, ok := req("regions"); ok {
		sc.Regions = p.regions(k, v)
	}
	if k, v, ok := fs.get("agents_per_region"); ok {
		if x, ok := p.integer("agents_per_region", k, v); ok {
			if x < 1 || x > 100_000 {
				p.errorf(k.Line, "agents_per_region", "must be in [1, 100000]")
			}
			sc.AgentsPerRegion = int(x)
		}
	}
	if _, v, ok := fs.get("network"); ok {
		p.network(v, &sc.Network)
	}
	if _, v, ok := fs.get("redis"); ok {
		if rf, ok := p.mapping(v, "redis", "latency"); ok {
			if k, v, ok := rf.get("latency"); ok {
				sc.Redis.Latency, _ = p.duration("redis.latency", k, v)
			}
		}
	}
	if k, v, ok := req("keys"); ok {
		sc.Keys = p.keys(k, v)
	}
	if k, v, ok := req("demand"); ok {
		sc.Demand = p.demand(k, v, sc)
	}
	if _, v, ok := fs.get("faults"); ok {
		sc.Faults = p.faults(v, sc)
	}
	p.checkTimes(fs, sc)
	return sc
}

func (p *parser) regions(k, v *yaml.Node) []string {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		p.errorf(k.Line, "regions", "must be a non-empty list of names (got %s)", describe(v))
		return nil
	}
	var out []string
	for i, n := range v.Content {
		path := fmt.Sprintf("regions[%d]", i)
		s, ok := p.str(path, n, n)
		if !ok {
			continue
		}
		if !validName(s) {
			p.errorf(n.Line, path, "must match [a-z0-9][a-z0-9_-]* (got %q)", s)
			continue
		}
		if slices.Contains(out, s) {
			p.errorf(n.Line, path, "duplicate region %q", s)
			continue
		}
		out = append(out, s)
	}
	if len(out) > 64 {
		p.errorf(k.Line, "regions", "at most 64 regions")
	}
	slices.Sort(out)
	return out
}

func validName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || i > 0 && (c == '_' || c == '-')) {
			return false
		}
	}
	return true
}

func (p *parser) network(v *yaml.Node, n *Network) {
	fs, ok := p.mapping(v, "network", "delay", "jitter", "loss", "clock_skew", "agent_rtt", "agent_jitter")
	if !ok {
		return
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"delay", &n.Delay}, {"jitter", &n.Jitter}, {"clock_skew", &n.ClockSkew}, {"agent_rtt", &n.AgentRTT}, {"agent_jitter", &n.AgentJitter}} {
		if k, v, ok := fs.get(d.name); ok {
			*d.dst, _ = p.duration("network."+d.name, k, v)
		}
	}
	if k, v, ok := fs.get("loss"); ok {
		if x, ok := p.number("network.loss", k, v); ok {
			if x < 0 || x >= 1 {
				p.errorf(k.Line, "network.loss", "must be in [0, 1)")
			}
			n.Loss = x
		}
	}
	if n.AgentRTT <= 0 {
		p.errorf(fs.line, "network.agent_rtt", "must be > 0")
	}
}

func (p *parser) keys(k, v *yaml.Node) []KeyGroup {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		p.errorf(k.Line, "keys", "must be a non-empty list (got %s)", describe(v))
		return nil
	}
	var out []KeyGroup
	total := 0
	for i, n := range v.Content {
		path := fmt.Sprintf("keys[%d]", i)
		fs, ok := p.mapping(n, path, "name", "limit", "limit_max", "burst", "cost", "count", "weight", "zipf", "on_error", "partition_reclaim_after")
		if !ok {
			continue
		}
		g := KeyGroup{Cost: 1, Count: 1, Weight: 1, OnError: "local"}
		if k, v, ok := fs.get("name"); !ok {
			p.errorf(n.Line, path+".name", "is required")
		} else if s, ok := p.str(path+".name", k, v); ok {
			if !validName(s) {
				p.errorf(k.Line, path+".name", "must match [a-z0-9][a-z0-9_-]* (got %q)", s)
			}
			for _, o := range out {
				if o.Name == s {
					p.errorf(k.Line, path+".name", "duplicate key group %q", s)
				}
			}
			g.Name = s
		}
		ints := []struct {
			name     string
			dst      *int64
			required bool
		}{{"limit", &g.Limit, true}, {"limit_max", &g.LimitMax, false}, {"burst", &g.Burst, false}, {"cost", &g.Cost, false}}
		for _, f := range ints {
			k, v, ok := fs.get(f.name)
			if !ok {
				if f.required {
					p.errorf(n.Line, path+"."+f.name, "is required")
				}
				continue
			}
			if x, ok := p.integer(path+"."+f.name, k, v); ok {
				if x < 1 || x > 1<<40 {
					p.errorf(k.Line, path+"."+f.name, "must be in [1, 2^40]")
				}
				*f.dst = x
			}
		}
		if k, v, ok := fs.get("count"); ok {
			if x, ok := p.integer(path+".count", k, v); ok {
				if x < 1 || x > 1_000_000 {
					p.errorf(k.Line, path+".count", "must be in [1, 1000000]")
				}
				g.Count = int(x)
			}
		}
		for _, f := range []struct {
			name string
			dst  *float64
		}{{"weight", &g.Weight}, {"zipf", &g.Zipf}} {
			if k, v, ok := fs.get(f.name); ok {
				if x, ok := p.number(path+"."+f.name, k, v); ok {
					if x < 0 || (f.name == "weight" && x == 0) {
						p.errorf(k.Line, path+"."+f.name, "must be > 0")
					}
					*f.dst = x
				}
			}
		}
		if k, v, ok := fs.get("on_error"); ok {
			if s, ok := p.str(path+".on_error", k, v); ok {
				if s != "local" && s != "open" && s != "closed" {
					p.errorf(k.Line, path+".on_error", `must be one of "local", "open", "closed" (got %q)`, s)
				}
				g.OnError = s
			}
		}
		if k, v, ok := fs.get("partition_reclaim_after"); ok {
			if d, ok := p.duration(path+".partition_reclaim_after", k, v); ok {
				if d < 0 || d > policy.MaxPeriod {
					p.errorf(k.Line, path+".partition_reclaim_after", "must be in [0, %s]", policy.MaxPeriod)
				}
				g.ReclaimAfter = d
			}
		}
		if g.LimitMax != 0 && g.LimitMax < g.Limit {
			k, _, _ := fs.get("limit_max")
			p.errorf(k.Line, path+".limit_max", "must be >= limit (%d)", g.Limit)
		}
		if g.Burst == 0 {
			g.Burst = g.Limit
		}
		if g.Cost > g.Burst {
			p.errorf(n.Line, path+".cost", "must be <= burst (%d)", g.Burst)
		}
		total += g.Count
		out = append(out, g)
	}
	if total > 1_000_000 {
		p.errorf(k.Line, "keys", "at most 1000000 keys in all (got %d)", total)
	}
	return out
}

func (p *parser) rates(path string, v *yaml.Node, sc *Scenario) map[string]float64 {
	fs, ok := p.mapping(v, path, sc.Regions...)
	if !ok {
		return nil
	}
	out := map[string]float64{}
	for _, r := range sc.Regions {
		if k, v, ok := fs.get(r); ok {
			if x, ok := p.number(path+"."+r, k, v); ok {
				if x < 0 || x > 1e8 {
					p.errorf(k.Line, path+"."+r, "must be in [0, 1e8] requests/s")
				}
				out[r] = x
			}
		}
	}
	return out
}

func (p *parser) demand(k, v *yaml.Node, sc *Scenario) []DemandStep {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		p.errorf(k.Line, "demand", "must be a non-empty list (got %s)", describe(v))
		return nil
	}
	var out []DemandStep
	for i, n := range v.Content {
		path := fmt.Sprintf("demand[%d]", i)
		fs, ok := p.mapping(n, path, "at", "ramp", "rates", "every", "alt_rates")
		if !ok {
			continue
		}
		st := DemandStep{Line: n.Line}
		if k, v, ok := fs.get("at"); !ok {
			p.errorf(n.Line, path+".at", "is required")
		} else {
			st.At, _ = p.duration(path+".at", k, v)
		}
		if k, v, ok := fs.get("ramp"); ok {
			st.Ramp, _ = p.duration(path+".ramp", k, v)
		}
		if _, v, ok := fs.get("rates"); !ok {
			p.errorf(n.Line, path+".rates", "is required")
		} else {
			st.Rates = p.rates(path+".rates", v, sc)
		}
		k1, v1, every := fs.get("every")
		k2, v2, alt := fs.get("alt_rates")
		switch {
		case every && alt:
			if d, ok := p.duration(path+".every", k1, v1); ok && d < sc.Step {
				p.errorf(k1.Line, path+".every", "must be at least step (%v)", sc.Step)
			} else {
				st.Every = d
			}
			st.AltRates = p.rates(path+".alt_rates", v2, sc)
		case every:
			p.errorf(k1.Line, path+".every", "needs alt_rates")
		case alt:
			p.errorf(k2.Line, path+".alt_rates", "needs every")
		}
		if i == 0 && st.At != 0 {
			p.errorf(n.Line, path+".at", "the first demand step must be at 0s")
		}
		if i > 0 && st.At <= out[i-1].At {
			p.errorf(n.Line, path+".at", "must be after the previous step's (%v)", out[i-1].At)
		}
		out = append(out, st)
	}
	return out
}

func (p *parser) faults(v *yaml.Node, sc *Scenario) []Fault {
	if v.Kind != yaml.SequenceNode {
		p.errorf(v.Line, "faults", "must be a list (got %s)", describe(v))
		return nil
	}
	var out []Fault
	for i, n := range v.Content {
		path := fmt.Sprintf("faults[%d]", i)
		fs, ok := p.mapping(n, path, "at", "partition", "for", "redis_failover", "lost_writes", "crash_agents", "add_agents", "region", "unreachable", "restart")
		if !ok {
			continue
		}
		f := Fault{Line: n.Line}
		if k, v, ok := fs.get("at"); !ok {
			p.errorf(n.Line, path+".at", "is required")
		} else {
			f.At, _ = p.duration(path+".at", k, v)
		}
		region := func(name string) {
			k, v, _ := fs.get(name)
			if s, ok := p.str(path+"."+name, k, v); ok {
				if sc.regionIndex(s) < 0 {
					p.errorf(k.Line, path+"."+name, "unknown region %q (regions: %s)", s, strings.Join(sc.Regions, ", "))
				}
				f.Region = s
			}
		}
		kinds := 0
		for _, kind := range []string{"partition", "redis_failover", "crash_agents", "add_agents", "unreachable", "restart"} {
			if _, _, ok := fs.get(kind); ok {
				kinds++
				f.Kind = kind
			}
		}
		if kinds != 1 {
			p.errorf(n.Line, path, "needs exactly one of partition, redis_failover, crash_agents, add_agents, unreachable, restart")
			continue
		}
		allowed := map[string][]string{
			"partition":      {"for"},
			"redis_failover": {"lost_writes"},
			"crash_agents":   {"region", "for"},
			"add_agents":     {"region"},
			"unreachable":    {"for"},
			"restart":        {"for"},
		}[f.Kind]
		for _, name := range []string{"for", "lost_writes", "region"} {
			if k, _, ok := fs.get(name); ok && !slices.Contains(allowed, name) {
				p.errorf(k.Line, path+"."+name, "does not apply to %s", f.Kind)
			}
		}
		switch f.Kind {
		case "partition", "redis_failover", "unreachable", "restart":
			region(f.Kind)
		case "crash_agents", "add_agents":
			if _, _, ok := fs.get("region"); !ok {
				p.errorf(n.Line, path+".region", "is required for %s", f.Kind)
			} else {
				region("region")
			}
		}
		if k, v, ok := fs.get("for"); ok {
			f.For, _ = p.duration(path+".for", k, v)
		} else if f.Kind == "partition" || f.Kind == "unreachable" || f.Kind == "restart" {
			p.errorf(n.Line, path+".for", "is required for %s", f.Kind)
		}
		if k, v, ok := fs.get("lost_writes"); ok {
			f.LostWrites, _ = p.duration(path+".lost_writes", k, v)
		}
		if k, v, ok := fs.get("crash_agents"); ok {
			if x, ok := p.number(path+".crash_agents", k, v); ok {
				if x <= 0 || x > 1 {
					p.errorf(k.Line, path+".crash_agents", "must be a fraction in (0, 1]")
				}
				f.Fraction = x
			}
		}
		if k, v, ok := fs.get("add_agents"); ok {
			if x, ok := p.integer(path+".add_agents", k, v); ok {
				if x < 1 || x > 100_000 {
					p.errorf(k.Line, path+".add_agents", "must be in [1, 100000]")
				}
				f.Agents = int(x)
			}
		}
		out = append(out, f)
	}
	return out
}

// checkTimes validates what depends on several fields.
func (p *parser) checkTimes(fs fields, sc *Scenario) {
	line := func(name string) int {
		if k, _, ok := fs.get(name); ok {
			return k.Line
		}
		return fs.line
	}
	if sc.Duration > 0 && sc.Step > 0 && sc.Duration%sc.Step != 0 {
		p.errorf(line("step"), "step", "must divide duration (%v)", sc.Duration)
	}
	if sc.Step > 100*time.Millisecond {
		p.errorf(line("step"), "step", "must be at most 100ms")
	}
	if sc.Grid != 0 && sc.Step > 0 && sc.Grid%sc.Step != 0 {
		p.errorf(line("grid"), "grid", "must be a multiple of step (%v)", sc.Step)
	}
	if sc.Grid > time.Second {
		p.errorf(line("grid"), "grid", "must be at most 1s")
	}
	if sc.LeaseTTL < sc.LeasePeriod {
		p.errorf(line("lease_ttl"), "lease_ttl", "must be at least lease_period (%v)", sc.LeasePeriod)
	}
	if sc.SyncPeriod < time.Millisecond {
		p.errorf(line("sync_period"), "sync_period", "must be at least 1ms")
	}
	for i, f := range sc.Faults {
		if f.At >= sc.Duration {
			p.errorf(f.Line, fmt.Sprintf("faults[%d].at", i), "must be before the end (%v)", sc.Duration)
		}
	}
	for i, d := range sc.Demand {
		if i > 0 && d.At >= sc.Duration {
			p.errorf(d.Line, fmt.Sprintf("demand[%d].at", i), "must be before the end (%v)", sc.Duration)
		}
	}
}

// describe names a node's kind and value for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "…"
		}
		switch n.ShortTag() {
		case "!!str":
			return fmt.Sprintf("string %q", v)
		case "!!int":
			return "integer " + v
		case "!!float":
			return "number " + v
		case "!!bool":
			return "boolean " + v
		case "!!null":
			return "null"
		}
	}
	return "an unexpected value"
}
