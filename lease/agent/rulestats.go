package agent

import (
	"sync"
	"sync/atomic"

	"github.com/ration-dev/ration/policy"
)

// A decision is counted under the rule that decided it (Decision.Rule):
// each rule name has a block of decision counters, striped like the
// agent's, so that counting stays an uncontended atomic add. Blocks are
// kept by name across policies (a rule that survives a new policy keeps
// its counts) and never freed, so at most maxRuleNames names get their
// own; later names share RuleOther's. A decision that no rule decided (no
// rule matched, or only shadow rules that would allow) counts under
// RuleNone. Neither label can be a rule's name, which starts with a
// letter or digit.
const (
	RuleNone     = "_none"
	RuleOther    = "_other"
	maxRuleNames = 1024
)

// ruleStats counts one rule name's decisions, a stripe per decision
// stripe.
type ruleStats struct {
	name    string
	stripes []ruleStripe
}

type ruleStripe struct {
	decisions [numPaths][2]atomic.Uint64 // [path][allowed]
	_         [cacheLine - numPaths*2*8%cacheLine]byte
}

// sum returns the decisions counted over every stripe.
func (rs *ruleStats) sum() (d [numPaths][2]uint64) {
	for i := range rs.stripes {
		st := &rs.stripes[i]
		for p := range st.decisions {
			d[p][0] += st.decisions[p][0].Load()
			d[p][1] += st.decisions[p][1].Load()
		}
	}
	return d
}

// ruleTable holds the blocks by name, and the rules of the policy in
// force by pointer (byRule, swapped with each policy), which the match of
// a decision reads.
type ruleTable struct {
	stripes int
	none    *ruleStats
	byRule  atomic.Pointer[map[*policy.Rule]*ruleStats]

	mu     sync.Mutex
	byName map[string]*ruleStats
	order  []*ruleStats // by first appearance, RuleNone first
}

func (t *ruleTable) init(stripes int) {
	t.stripes = stripes
	t.byName = make(map[string]*ruleStats)
	t.none = t.blockLocked(RuleNone)
	t.byRule.Store(new(map[*policy.Rule]*ruleStats))
}

// blockLocked returns the block of name, making it if need be (t.mu held,
// or during init).
func (t *ruleTable) blockLocked(name string) *ruleStats {
	if rs := t.byName[name]; rs != nil {
		return rs
	}
	if name != RuleNone && name != RuleOther && len(t.byName) >= maxRuleNames+1 {
		return t.blockLocked(RuleOther)
	}
	rs := &ruleStats{name: name, stripes: make([]ruleStripe, t.stripes)}
	t.byName[name] = rs
	t.order = append(t.order, rs)
	return rs
}

// setPolicy maps set's rules to their blocks. Called before set is put in
// force, so that a decision matching set's rules finds them.
func (t *ruleTable) setPolicy(set *policy.Set) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := make(map[*policy.Rule]*ruleStats, len(set.Rules()))
	for _, r := range set.Rules() {
		m[r] = t.blockLocked(r.Name)
	}
	t.byRule.Store(&m)
}

// of returns the block of rule r. A rule of a policy replaced since the
// decision matched it is looked up by name.
func (t *ruleTable) of(r *policy.Rule) *ruleStats {
	if rs := (*t.byRule.Load())[r]; rs != nil {
		return rs
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.blockLocked(r.Name)
}

// snapshot returns every block's decisions, by name.
func (t *ruleTable) snapshot() map[string][numPaths][2]uint64 {
	t.mu.Lock()
	blocks := append([]*ruleStats(nil), t.order...)
	t.mu.Unlock()
	m := make(map[string][numPaths][2]uint64, len(blocks))
	for _, rs := range blocks {
		m[rs.name] = rs.sum()
	}
	return m
}
