package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ration-dev/ration/region"
)

// Set is a validated, immutable rule set, made by Parse. It is safe for
// concurrent use. A nil *Set is an empty set: it has no rules and matches
// nothing, so an agent can call Match before its first policy arrives.
type Set struct {
	rules   []*Rule
	byName  map[string]*Rule
	index   map[string]*keyIndex
	version string
	source  []byte
	// replaces: some rule has Replaces, so Match must filter.
	replaces bool

	defsOnce sync.Once
	defs     []region.RuleDef
}

// keyIndex holds the rules anchored on one descriptor name. Every rule is
// anchored on exactly one condition it requires (see anchor), so Match
// visits each rule at most once per occurrence of the descriptor in a
// request, and only rules whose anchor holds.
type keyIndex struct {
	// present lists rules anchored on the descriptor being present.
	present []int32
	// exact lists, per value, rules anchored on the descriptor having that
	// value. Nil when no rule is.
	exact map[string][]int32
}

func newSet(rules []*Rule, source []byte) *Set {
	s := &Set{
		rules:  rules,
		byName: make(map[string]*Rule, len(rules)),
		index:  make(map[string]*keyIndex),
		source: source,
	}
	for i, r := range rules {
		s.byName[r.Name] = r
		s.anchor(int32(i), r)
		s.replaces = s.replaces || len(r.Replaces) > 0
	}
	s.version = version(rules)
	return s
}

// anchor files rule i under the most selective condition it requires: an
// exact value if it has one (a value splits requests far more than a name
// does), else a descriptor's presence; among equals, the one whose list is
// shortest so far, so rules spread over lists instead of piling onto one.
func (s *Set) anchor(i int32, r *Rule) {
	bestKey, bestValue, bestLen := "", "", -1
	for _, m := range r.Match {
		if m.Value == Wildcard {
			continue
		}
		n := 0
		if ki := s.index[m.Key]; ki != nil {
			n = len(ki.exact[m.Value])
		}
		if bestLen < 0 || n < bestLen {
			bestKey, bestValue, bestLen = m.Key, m.Value, n
		}
	}
	if bestLen >= 0 {
		ki := s.keyIndex(bestKey)
		if ki.exact == nil {
			ki.exact = make(map[string][]int32)
		}
		ki.exact[bestValue] = append(ki.exact[bestValue], i)
		return
	}
	// No exact value: anchor on a required name (a Key name, or a Match
	// name with the wildcard). Validation guarantees Key is not empty.
	best := "" // bestLen is still -1
	consider := func(name string) {
		n := 0
		if ki := s.index[name]; ki != nil {
			n = len(ki.present)
		}
		if bestLen < 0 || n < bestLen {
			best, bestLen = name, n
		}
	}
	for _, name := range r.Key {
		consider(name)
	}
	for _, m := range r.Match {
		consider(m.Key)
	}
	for _, m := range r.MatchPrefix {
		consider(m.Key)
	}
	ki := s.keyIndex(best)
	ki.present = append(ki.present, i)
}

func (s *Set) keyIndex(name string) *keyIndex {
	ki := s.index[name]
	if ki == nil {
		ki = &keyIndex{}
		s.index[name] = ki
	}
	return ki
}

// HasReplaces reports whether some rule of the set replaces others.
func (s *Set) HasReplaces() bool { return s != nil && s.replaces }

// Rules returns the rules in file order. The slice and the rules are
// shared and must not be modified.
func (s *Set) Rules() []*Rule {
	if s == nil {
		return nil
	}
	return s.rules[:len(s.rules):len(s.rules)]
}

// Rule returns the rule called name, or nil if there is none.
func (s *Set) Rule(name string) *Rule {
	if s == nil {
		return nil
	}
	return s.byName[name]
}

// Version is a hash of the set's canonical form (16 hex digits): the rules
// in order with every default filled in. It ignores comments, layout, key
// order within a mapping and line numbers, so it changes exactly when the
// meaning of the set does. A nil Set's version is "".
func (s *Set) Version() string {
	if s == nil {
		return ""
	}
	return s.version
}

// Source returns the document the set was parsed from. It must not be
// modified.
func (s *Set) Source() []byte {
	if s == nil {
		return nil
	}
	return s.source
}

// Match appends to dst the rules that apply to the request ds (Rule.Applies),
// in file order, and returns the extended slice. It does not allocate when
// dst has capacity for the result. ds may be in any order and may repeat a
// name; the first occurrence counts.
//
// A rule named in the Replaces of another rule that applies is left out.
//
// The cost is a map lookup per descriptor plus a check of each rule whose
// anchor condition holds, not a check of every rule.
func (s *Set) Match(dst []*Rule, ds []Descriptor) []*Rule {
	if s == nil || len(s.rules) == 0 {
		return dst
	}
	// A bitmap of candidates, on the stack, yields them in file order with
	// no sort and no allocation. Small sets use a small one so that zeroing
	// it costs nothing; MaxRules bounds the large one.
	start := len(dst)
	if len(s.rules) <= 8*64 {
		var marks [8]uint64
		dst = s.match(dst, ds, marks[:])
	} else {
		var marks [(MaxRules + 63) / 64]uint64
		dst = s.match(dst, ds, marks[:])
	}
	if s.replaces {
		dst = dropReplaced(dst, start)
	}
	return dst
}

// dropReplaced removes from dst[start:], in place, every rule that another
// rule of dst[start:] replaces. A replaced rule's own Replaces still count,
// as in Envoy's rate limit service.
func dropReplaced(dst []*Rule, start int) []*Rule {
	matched := dst[start:]
	replaced := func(r *Rule) bool {
		for _, q := range matched {
			if q != r && slices.Contains(q.Replaces, r.Name) {
				return true
			}
		}
		return false
	}
	// Mark first, then compact: a replaced rule's Replaces must still be
	// seen. Up to 64 rules mark in a word; more (rare) in a slice.
	var word uint64
	var many []bool
	if len(matched) > 64 {
		many = make([]bool, len(matched))
	}
	for i, r := range matched {
		if replaced(r) {
			if many != nil {
				many[i] = true
			} else {
				word |= 1 << i
			}
		}
	}
	if word == 0 && many == nil {
		return dst
	}
	n := start
	for i, r := range matched {
		if (many != nil && many[i]) || (many == nil && word&(1<<i) != 0) {
			continue
		}
		dst[n] = r
		n++
	}
	return dst[:n]
}

func (s *Set) match(dst []*Rule, ds []Descriptor, marks []uint64) []*Rule {
	for i := range ds {
		ki := s.index[ds[i].Key]
		if ki == nil {
			continue
		}
		for _, r := range ki.present {
			marks[r>>6] |= 1 << (r & 63)
		}
		if ki.exact != nil {
			for _, r := range ki.exact[ds[i].Value] {
				marks[r>>6] |= 1 << (r & 63)
			}
		}
	}
	for w, word := range marks[:(len(s.rules)+63)/64] {
		for word != 0 {
			r := s.rules[w*64+bits.TrailingZeros64(word)]
			word &= word - 1
			if r.Applies(ds) {
				dst = append(dst, r)
			}
		}
	}
	return dst
}

// version hashes the canonical form of rules. The form is versioned text,
// one line per rule with every field in a fixed order, so that a new field
// changes every Version only when the form's version string changes too.
// Fields added within v1 (the fixed window's) are written only when they
// are not the default, so the rules that existed before them keep their
// Version.
func version(rules []*Rule) string {
	var b strings.Builder
	b.WriteString("ration-policy v1\n")
	for _, r := range rules {
		b.WriteString("rule ")
		b.WriteString(strconv.Quote(r.Name))
		b.WriteString(" match")
		for _, m := range r.Match {
			b.WriteByte(' ')
			b.WriteString(strconv.Quote(m.Key))
			b.WriteByte('=')
			b.WriteString(strconv.Quote(m.Value))
		}
		b.WriteString(" key")
		for _, k := range r.Key {
			b.WriteByte(' ')
			b.WriteString(strconv.Quote(k))
		}
		for _, kv := range []struct {
			name string
			v    int64
		}{
			{"limit", r.Limit},
			{"period_ns", int64(r.Period)},
			{"burst", r.Burst},
			{"cost", r.Cost},
			{"partition_reclaim_after_ns", int64(r.PartitionReclaimAfter)},
		} {
			b.WriteString(" " + kv.name + " " + strconv.FormatInt(kv.v, 10))
		}
		b.WriteString(" scope " + string(r.Scope))
		b.WriteString(" on_error " + string(r.OnError))
		b.WriteString(" shadow " + strconv.FormatBool(r.Shadow))
		b.WriteString(" start_empty " + strconv.FormatBool(r.StartEmpty))
		for _, c := range r.Clients {
			b.WriteString(" client " + strconv.Quote(c))
		}
		// The Envoy fields, written only when set: older rules keep their
		// Version.
		for _, m := range r.MatchPrefix {
			b.WriteString(" match_prefix " + strconv.Quote(m.Key) + "=" + strconv.Quote(m.Value))
		}
		for _, e := range r.Except {
			b.WriteString(" except " + strconv.Quote(e.Key) + "=" + strconv.Quote(e.Value))
		}
		for _, n := range r.Replaces {
			b.WriteString(" replaces " + strconv.Quote(n))
		}
		if r.AllowDescriptorLimit {
			b.WriteString(" allow_descriptor_limit true")
		}
		if r.FixedWindow() {
			b.WriteString(" algorithm " + string(r.Algorithm))
			b.WriteString(" calendar " + strconv.Quote(string(r.Calendar)))
			b.WriteString(" time_zone " + strconv.Quote(r.location().String()))
		}
		b.WriteByte('\n')
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:8])
}
