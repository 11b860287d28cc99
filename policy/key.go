package policy

import (
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
	return region.KeyPolicy{Rate: r.Rate(), ReclaimAfter: r.PartitionReclaimAfter, Cost: float64(r.Cost), Burst: float64(r.Burst)}
}
