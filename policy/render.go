package policy

import (
	"bytes"
	"fmt"

	"time"

	"go.yaml.in/yaml/v3"
)

// ruleDoc is a rule as Format writes it: the fields of the YAML format in
// the order people write them, defaults left out.
type ruleDoc struct {
	Name                  string              `yaml:"name"`
	Match                 map[string]string   `yaml:"match,omitempty,flow"`
	MatchPrefix           map[string]string   `yaml:"match_prefix,omitempty,flow"`
	Key                   []string            `yaml:"key,flow"`
	Algorithm             string              `yaml:"algorithm,omitempty"`
	Limit                 int64               `yaml:"limit"`
	Period                string              `yaml:"period,omitempty"`
	TimeZone              string              `yaml:"time_zone,omitempty"`
	Burst                 int64               `yaml:"burst,omitempty"`
	Cost                  int64               `yaml:"cost,omitempty"`
	Scope                 string              `yaml:"scope,omitempty"`
	OnError               string              `yaml:"on_error,omitempty"`
	Shadow                bool                `yaml:"shadow,omitempty"`
	PartitionReclaimAfter string              `yaml:"partition_reclaim_after,omitempty"`
	StartEmpty            bool                `yaml:"start_empty,omitempty"`
	Clients               []string            `yaml:"clients,omitempty"`
	Except                map[string][]string `yaml:"except,omitempty,flow"`
	Replaces              []string            `yaml:"replaces,omitempty,flow"`
	AllowDescriptorLimit  bool                `yaml:"allow_descriptor_limit,omitempty"`
}

// Format writes rules as a policy document that Parse reads back into the
// same rules (the same Version): what regiond sends agents for a policy it
// derived (Stage, Stricter), and what tools print. Fields that hold their
// default are left out; yaml quotes every string that needs it.
func Format(rules []*Rule) []byte {
	doc := struct {
		Rules []ruleDoc `yaml:"rules"`
	}{Rules: make([]ruleDoc, 0, len(rules))}
	for _, r := range rules {
		doc.Rules = append(doc.Rules, formatRule(r))
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		panic(fmt.Sprintf("policy: formatting rules: %v", err)) // not reached: plain values
	}
	_ = enc.Close()
	return b.Bytes()
}

func formatRule(r *Rule) ruleDoc {
	d := ruleDoc{Name: r.Name, Key: r.Key, Limit: r.Limit, Clients: r.Clients, Shadow: r.Shadow, StartEmpty: r.StartEmpty}
	d.Replaces, d.AllowDescriptorLimit = r.Replaces, r.AllowDescriptorLimit
	if len(r.MatchPrefix) > 0 {
		d.MatchPrefix = make(map[string]string, len(r.MatchPrefix))
		for _, m := range r.MatchPrefix {
			d.MatchPrefix[m.Key] = m.Value
		}
	}
	if len(r.Except) > 0 {
		d.Except = make(map[string][]string)
		for _, e := range r.Except {
			d.Except[e.Key] = append(d.Except[e.Key], e.Value)
		}
	}
	if len(r.Match) > 0 {
		d.Match = make(map[string]string, len(r.Match))
		for _, m := range r.Match {
			d.Match[m.Key] = m.Value
		}
	}
	if r.FixedWindow() {
		d.Algorithm = string(AlgorithmFixedWindow)
		if loc := r.location(); loc.String() != "UTC" {
			d.TimeZone = loc.String()
		}
	}
	switch {
	case r.Calendar != "":
		d.Period = string(r.Calendar)
	case r.Period != time.Second:
		d.Period = r.Period.String()
	}
	if !r.FixedWindow() && r.Burst != r.Limit {
		d.Burst = r.Burst
	}
	if r.Cost != 1 {
		d.Cost = r.Cost
	}
	if r.Scope == ScopeRegion {
		d.Scope = string(r.Scope)
	}
	if r.OnError != "" && r.OnError != OnErrorLocal {
		d.OnError = string(r.OnError)
	}
	if r.PartitionReclaimAfter > 0 {
		d.PartitionReclaimAfter = r.PartitionReclaimAfter.String()
	}
	return d
}

// Derive validates rules as a document (Format, then Parse under name): a
// Set whose Source is YAML that agents can parse. Rules are not modified.
func Derive(name string, rules []*Rule) (*Set, error) {
	return Parse(name, Format(rules))
}
