package policy

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/ration-dev/ration/region"
)

// StoreKey is the identity of one rule's key wherever a region keeps it: its
// bucket in the allocator, its entry in the exchange's reports and state.
// It is the rule's name, a slash, and the key (the rule's descriptor values
// as AppendKey formats them). Rule names contain no slash, so SplitStoreKey
// undoes it.
func StoreKey(rule, key string) string { return rule + "/" + key }

// AppendStoreKey appends StoreKey(rule, key) to dst.
func AppendStoreKey(dst []byte, rule, key string) []byte {
	dst = append(dst, rule...)
	dst = append(dst, '/')
	return append(dst, key...)
}

// SplitStoreKey returns the rule name and the key of a store key; ok is
// false for a string that StoreKey did not make.
func SplitStoreKey(storeKey string) (rule, key string, ok bool) {
	return strings.Cut(storeKey, "/")
}

// RuleOf returns the rule of a store key, nil when the set has none.
func (s *Set) RuleOf(storeKey string) *Rule {
	name, _, ok := SplitStoreKey(storeKey)
	if !ok {
		return nil
	}
	return s.Rule(name)
}

// KeyPolicy is what the cross-region exchange needs of the rule: its rate,
// its cost and its partition_reclaim_after. A nil rule (a key whose rule
// left the policy) has none: its needs are relative, and it never reclaims.
func (r *Rule) KeyPolicy() region.KeyPolicy {
	if r == nil {
		return region.KeyPolicy{}
	}
	return region.KeyPolicy{Rule: r.Name, Rate: r.Rate(), ReclaimAfter: r.PartitionReclaimAfter, Cost: float64(r.Cost), Burst: float64(r.Burst), FixedWindow: r.FixedWindow()}
}

// Fingerprint hashes what the rule admits: its algorithm, limit, period,
// calendar, time zone, burst and cost. Two regions that enforce one global
// rule with different fingerprints disagree on its quota, and the exchange
// holds its keys until they agree (docs/DESIGN.md, "Regions agree before
// they exchange"). Match, key, scope and failure mode are left out: they
// change which requests count, not the quota the regions share.
func (r *Rule) Fingerprint() uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "v1 %t %d %d %q %d %d", r.FixedWindow(), r.Limit, int64(r.Period), r.Calendar, r.Burst, r.Cost)
	if r.FixedWindow() {
		fmt.Fprintf(h, " %q", r.location().String())
	}
	return h.Sum64()
}

// Def is the rule's definition as the exchange compares it across regions.
func (r *Rule) Def() region.RuleDef {
	return region.RuleDef{Name: r.Name, Fingerprint: r.Fingerprint(), FixedWindow: r.FixedWindow(),
		Limit: r.Limit, Period: r.Period, Burst: r.Burst, Cost: r.Cost}
}

// Defs returns the definitions of the set's global rules, in the set's
// order: what a region's reports carry. Computed once per set.
func (s *Set) Defs() []region.RuleDef {
	if s == nil {
		return nil
	}
	s.defsOnce.Do(func() {
		for _, r := range s.rules {
			if r.Scope == ScopeGlobal || r.Scope == "" {
				s.defs = append(s.defs, r.Def())
			}
		}
	})
	return s.defs
}
