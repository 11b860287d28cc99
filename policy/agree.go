package policy

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"time"

	"github.com/ration-dev/ration/region"
)

// Stricter returns s with each global rule named in theirs replaced by the
// stricter of its own definition and every definition given there (other
// regions' definitions of the rule, which the exchange found differ;
// docs/DESIGN.md, "Regions agree before they exchange"): its algorithm and
// period stay, its limit is the smallest of the limits scaled to its
// period, its burst the smallest burst, its cost the largest cost, each
// clamped so that the rule stays valid. changed lists the rules replaced,
// in s's order; with none, the result is s itself. Names that are not a
// global rule of s are ignored.
func (s *Set) Stricter(theirs map[string][]region.RuleDef) (set *Set, changed []string, err error) {
	if s == nil || len(theirs) == 0 {
		return s, nil, nil
	}
	rules := make([]*Rule, 0, len(s.rules))
	for _, r := range s.rules {
		defs := theirs[r.Name]
		if len(defs) == 0 || r.Scope == ScopeRegion {
			rules = append(rules, r)
			continue
		}
		c := stricter(r, defs)
		if c.Limit == r.Limit && c.Burst == r.Burst && c.Cost == r.Cost {
			rules = append(rules, r)
			continue
		}
		rules = append(rules, c)
		changed = append(changed, r.Name)
	}
	if len(changed) == 0 {
		return s, nil, nil
	}
	set, err = Derive("stricter of "+s.Version()+" and its peers' rules "+strings.Join(changed, ", "), rules)
	if err != nil {
		return nil, nil, fmt.Errorf("policy: the stricter rules %v: %w", changed, err)
	}
	return set, changed, nil
}

// stricter is r made at least as strict as each of defs.
func stricter(r *Rule, defs []region.RuleDef) *Rule {
	c := *r
	for _, d := range defs {
		if l, ok := scaleLimit(d.Limit, d.Period, r.Period); ok && l < c.Limit {
			c.Limit = max(1, l)
		}
		if d.Burst > 0 {
			c.Burst = min(c.Burst, d.Burst)
		}
		c.Cost = max(c.Cost, d.Cost)
	}
	// A request must fit the bucket (a window), and a larger cost must not
	// make the rule looser: it is capped where it would raise the capacity
	// above ours.
	if c.FixedWindow() {
		c.Cost = min(c.Cost, c.Limit)
		c.Burst = c.Limit // a window's capacity is its limit
	} else {
		c.Cost = min(c.Cost, max(c.Limit, r.Cost))
		c.Burst = max(c.Burst, c.Cost)
	}
	return &c
}

// scaleLimit is limit tokens per from expressed per to, rounded down,
// exactly (limits reach 2⁵³); ok is false for a period that is not
// positive or a result beyond int64.
func scaleLimit(limit int64, from, to time.Duration) (int64, bool) {
	if from <= 0 || to <= 0 || limit <= 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(limit), uint64(to))
	if hi >= uint64(from) {
		return 0, false
	}
	q, _ := bits.Div64(hi, lo, uint64(from))
	if q > math.MaxInt64 {
		return 0, false
	}
	return int64(q), true
}

// Agreed returns the set to enforce while regions disagree on some of its
// global rules (the exchange's Disagreements): Stricter with every other
// definition of each. changed lists the rules replaced; with none, it is s
// itself.
func (s *Set) Agreed(ds []region.Disagreement) (set *Set, changed []string, err error) {
	if len(ds) == 0 {
		return s, nil, nil
	}
	theirs := make(map[string][]region.RuleDef, len(ds))
	for _, d := range ds {
		for _, t := range d.Theirs {
			theirs[d.Rule] = append(theirs[d.Rule], t.Def)
		}
	}
	return s.Stricter(theirs)
}

// StagedSuffix ends the name of a staged rule's shadow copy (Stage).
const StagedSuffix = ".staged"

// IsStaged reports whether r is the shadow copy of a rule of a staged
// revision (Stage): a shadow rule whose name ends with StagedSuffix.
func (r *Rule) IsStaged() bool { return r.Shadow && strings.HasSuffix(r.Name, StagedSuffix) }

// Stage returns the policy that decides a staged revision beside the
// enforced one without enforcing it: every rule of enforced, then, for each
// rule of staged that is new or defined otherwise than the enforced rule of
// its name, a shadow copy named name + StagedSuffix. A copy has its own
// buckets (its keys are StoreKeys of its own name), so it never spends the
// enforced rule's tokens, and what it would have denied is recorded as for
// any shadow rule. A rule that staged removes stays enforced: a removal
// cannot be shadowed. With nothing to stage it returns enforced itself.
func Stage(enforced, staged *Set) (*Set, error) {
	if staged == nil {
		return enforced, nil
	}
	rules := append([]*Rule(nil), enforced.Rules()...)
	n := len(rules)
	for _, r := range staged.Rules() {
		if old := enforced.Rule(r.Name); old != nil && version([]*Rule{old}) == version([]*Rule{r}) {
			continue
		}
		c := *r
		c.Name, c.Shadow = r.Name+StagedSuffix, true
		if len(c.Name) > maxNameLen {
			return nil, fmt.Errorf("policy: staging rule %s: its shadow copy's name %q is longer than %d bytes", r.Name, c.Name, maxNameLen)
		}
		if enforced.Rule(c.Name) != nil {
			return nil, fmt.Errorf("policy: staging rule %s: the enforced policy has a rule named %q already", r.Name, c.Name)
		}
		rules = append(rules, &c)
	}
	if len(rules) == n {
		return enforced, nil
	}
	return Derive("enforced "+enforced.Version()+" with staged "+staged.Version(), rules)
}
