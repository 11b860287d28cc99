package sim

import (
	"fmt"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/internal/yamlfield"
	"github.com/ration-dev/ration/policy"
)

func (p *parser) regions(f yamlfield.Field) []string {
	var out []string
	for i, n := range p.nonEmptyList(f, "regions", " of names") {
		path := fmt.Sprintf("regions[%d]", i)
		s, ok := p.Str(yamlfield.Item(n), path)
		if !ok {
			continue
		}
		if !validName(s) {
			p.Errorf(n.Line, path, "must match [a-z0-9][a-z0-9_-]* (got %q)", s)
			continue
		}
		if slices.Contains(out, s) {
			p.Errorf(n.Line, path, "duplicate region %q", s)
			continue
		}
		out = append(out, s)
	}
	if len(out) > 64 {
		p.Errorf(f.Key.Line, "regions", "at most 64 regions")
	}
	slices.Sort(out)
	return out
}

// validName checks a region or key group name: [a-z0-9][a-z0-9_-]*, at
// most 32 bytes.
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
		if f, ok := fs.Get(d.name); ok {
			*d.dst, _ = p.duration(f, "network."+d.name)
		}
	}
	if f, ok := fs.Get("loss"); ok {
		if x, ok := p.Number(f, "network.loss"); ok {
			if x < 0 || x >= 1 {
				p.Errorf(f.Key.Line, "network.loss", "must be in [0, 1)")
			}
			n.Loss = x
		}
	}
	if n.AgentRTT <= 0 {
		p.Errorf(fs.line, "network.agent_rtt", "must be > 0")
	}
}

func (p *parser) keys(f yamlfield.Field) []KeyGroup {
	var out []KeyGroup
	total := 0
	for i, n := range p.nonEmptyList(f, "keys", "") {
		if g, ok := p.keyGroup(n, fmt.Sprintf("keys[%d]", i), out); ok {
			total += g.Count
			out = append(out, g)
		}
	}
	if total > 1_000_000 {
		p.Errorf(f.Key.Line, "keys", "at most 1000000 keys in all (got %d)", total)
	}
	return out
}

var keyGroupFields = []string{"name", "limit", "limit_max", "period", "algorithm", "time_zone", "burst", "cost", "count",
	"weight", "zipf", "on_error", "partition_reclaim_after"}

// keyGroup decodes one key group; earlier are the groups before it, whose
// names it must not repeat. It returns ok=false only when n is not a
// mapping.
func (p *parser) keyGroup(n *yaml.Node, path string, earlier []KeyGroup) (KeyGroup, bool) {
	fs, ok := p.mapping(n, path, keyGroupFields...)
	if !ok {
		return KeyGroup{}, false
	}
	g := KeyGroup{Period: time.Second, RuleAlgorithm: TokenBucket, Cost: 1, Count: 1, Weight: 1, OnError: "local"}
	if f, ok := p.required(fs, path, "name"); ok {
		g.Name = p.groupName(f, path+".name", earlier)
	}
	p.groupAlgorithm(fs, path, &g)
	p.groupTokens(fs, path, &g)
	p.groupSpread(fs, path, &g)
	p.groupRule(fs, path, &g)
	if g.LimitMax != 0 && g.LimitMax < g.Limit {
		f, _ := fs.Get("limit_max")
		p.Errorf(f.Key.Line, path+".limit_max", "must be >= limit (%d)", g.Limit)
	}
	if g.Burst == 0 {
		g.Burst = g.Limit
	}
	switch {
	case g.Cost <= g.Burst:
	case g.RuleAlgorithm == FixedWindow:
		p.Errorf(n.Line, path+".cost", "must be <= limit (%d), the tokens of one window", g.Limit)
	default:
		p.Errorf(n.Line, path+".cost", "must be <= burst (%d)", g.Burst)
	}
	return g, true
}

func (p *parser) groupName(f yamlfield.Field, path string, earlier []KeyGroup) string {
	s, ok := p.Str(f, path)
	if !ok {
		return ""
	}
	if !validName(s) {
		p.Errorf(f.Key.Line, path, "must match [a-z0-9][a-z0-9_-]* (got %q)", s)
	}
	for _, o := range earlier {
		if o.Name == s {
			p.Errorf(f.Key.Line, path, "duplicate key group %q", s)
		}
	}
	return s
}

// groupTokens decodes the limits, burst and cost.
func (p *parser) groupTokens(fs fields, path string, g *KeyGroup) {
	ints := []struct {
		name     string
		dst      *int64
		required bool
	}{{"limit", &g.Limit, true}, {"limit_max", &g.LimitMax, false}, {"burst", &g.Burst, false}, {"cost", &g.Cost, false}}
	for _, t := range ints {
		if t.name == "burst" && g.RuleAlgorithm == FixedWindow {
			continue // the policy refuses it (groupAlgorithm)
		}
		f, ok := fs.Get(t.name)
		if !ok {
			if t.required {
				p.Errorf(fs.line, path+"."+t.name, "is required")
			}
			continue
		}
		if x, ok := p.intIn(f, path+"."+t.name, 1, 1<<40, "1, 2^40"); ok {
			*t.dst = x
		}
	}
}

// groupSpread decodes how many keys the group has and how its requests
// spread over them.
func (p *parser) groupSpread(fs fields, path string, g *KeyGroup) {
	if f, ok := fs.Get("count"); ok {
		if x, ok := p.intIn(f, path+".count", 1, 1_000_000, "1, 1000000"); ok {
			g.Count = int(x)
		}
	}
	for _, w := range []struct {
		name string
		dst  *float64
	}{{"weight", &g.Weight}, {"zipf", &g.Zipf}} {
		if f, ok := fs.Get(w.name); ok {
			if x, ok := p.Number(f, path+"."+w.name); ok {
				if x < 0 || (w.name == "weight" && x == 0) {
					p.Errorf(f.Key.Line, path+"."+w.name, "must be > 0")
				}
				*w.dst = x
			}
		}
	}
}

// groupRule decodes the rule's failure mode and partition_reclaim_after.
func (p *parser) groupRule(fs fields, path string, g *KeyGroup) {
	if f, ok := fs.Get("on_error"); ok {
		if s, ok := p.Str(f, path+".on_error"); ok {
			if s != "local" && s != "open" && s != "closed" {
				p.Errorf(f.Key.Line, path+".on_error", `must be one of "local", "open", "closed" (got %q)`, s)
			}
			g.OnError = s
		}
	}
	if f, ok := fs.Get("partition_reclaim_after"); ok {
		if d, ok := p.duration(f, path+".partition_reclaim_after"); ok {
			if d < 0 || d > policy.MaxReclaimAfter {
				p.Errorf(f.Key.Line, path+".partition_reclaim_after", "must be in [0, %s]", policy.MaxReclaimAfter)
			}
			g.ReclaimAfter = d
		}
	}
}
