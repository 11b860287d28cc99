package kvstore

import (
	"strconv"
	"strings"

	"github.com/ration-dev/ration/policy"
)

// The kinds of a RuleChange.
const (
	RuleAdded   = "added"
	RuleRemoved = "removed"
	RuleChanged = "changed"
)

// RuleChange is how one rule differs between two policies.
type RuleChange struct {
	// Rule is the rule's name.
	Rule string
	// Kind is RuleAdded, RuleRemoved or RuleChanged.
	Kind string
	// Fields are the fields that differ, in the document's order of
	// fields, for RuleChanged.
	Fields []FieldChange
}

// FieldChange is one field of a changed rule, its values as YAML would
// write them.
type FieldChange struct {
	Field    string
	Old, New string
}

// String renders the change on one line: "+ name", "- name", or
// "~ name: limit 500 -> 600, scope global -> region".
func (c RuleChange) String() string {
	switch c.Kind {
	case RuleAdded:
		return "+ " + c.Rule
	case RuleRemoved:
		return "- " + c.Rule
	}
	parts := make([]string, len(c.Fields))
	for i, f := range c.Fields {
		parts[i] = f.Field + " " + f.Old + " -> " + f.New
	}
	return "~ " + c.Rule + ": " + strings.Join(parts, ", ")
}

// RuleChanges compares two policies rule by rule, matching rules by name:
// the rules of b that are new or changed, in b's order, then those of a
// that b lacks, in a's order. A nil Set has no rules. Two sets that differ
// only in the order of their rules have different Versions and no
// RuleChanges.
func RuleChanges(a, b *policy.Set) []RuleChange {
	var out []RuleChange
	for _, nr := range b.Rules() {
		or := a.Rule(nr.Name)
		if or == nil {
			out = append(out, RuleChange{Rule: nr.Name, Kind: RuleAdded})
			continue
		}
		if fs := ruleFields(or, nr); len(fs) > 0 {
			out = append(out, RuleChange{Rule: nr.Name, Kind: RuleChanged, Fields: fs})
		}
	}
	for _, or := range a.Rules() {
		if b.Rule(or.Name) == nil {
			out = append(out, RuleChange{Rule: or.Name, Kind: RuleRemoved})
		}
	}
	return out
}

// ruleFields lists the fields of two rules of one name that differ.
func ruleFields(a, b *policy.Rule) []FieldChange {
	var out []FieldChange
	field := func(name, was, now string) {
		if was != now {
			out = append(out, FieldChange{Field: name, Old: was, New: now})
		}
	}
	field("match", matchString(a.Match), matchString(b.Match))
	field("key", listString(a.Key), listString(b.Key))
	field("algorithm", algorithm(a), algorithm(b))
	field("limit", strconv.FormatInt(a.Limit, 10), strconv.FormatInt(b.Limit, 10))
	field("period", period(a), period(b))
	field("time_zone", zone(a), zone(b))
	field("burst", strconv.FormatInt(a.Burst, 10), strconv.FormatInt(b.Burst, 10))
	field("cost", strconv.FormatInt(a.Cost, 10), strconv.FormatInt(b.Cost, 10))
	field("scope", string(a.Scope), string(b.Scope))
	field("on_error", string(a.OnError), string(b.OnError))
	field("shadow", strconv.FormatBool(a.Shadow), strconv.FormatBool(b.Shadow))
	field("partition_reclaim_after", a.PartitionReclaimAfter.String(), b.PartitionReclaimAfter.String())
	field("start_empty", strconv.FormatBool(a.StartEmpty), strconv.FormatBool(b.StartEmpty))
	field("clients", listString(a.Clients), listString(b.Clients))
	return out
}

func matchString(ds []policy.Descriptor) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Key + ": " + strconv.Quote(d.Value)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func listString(ss []string) string { return "[" + strings.Join(ss, ", ") + "]" }

func algorithm(r *policy.Rule) string {
	if r.FixedWindow() {
		return string(policy.AlgorithmFixedWindow)
	}
	return string(policy.AlgorithmTokenBucket)
}

func period(r *policy.Rule) string {
	if r.Calendar != "" {
		return string(r.Calendar)
	}
	return r.Period.String()
}

// zone is a fixed window's time zone; a token bucket has none.
func zone(r *policy.Rule) string {
	if !r.FixedWindow() {
		return "-"
	}
	if r.Location == nil {
		return "UTC"
	}
	return r.Location.String()
}
