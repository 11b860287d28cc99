package main

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/kvstore"
)

// revisionJSON is a revision as the JSON output shows it.
type revisionJSON struct {
	Revision      uint64    `json:"revision"`
	Key           string    `json:"key"`
	Op            string    `json:"op"`
	Author        string    `json:"author"`
	ClaimedAuthor string    `json:"claimed_author,omitempty"`
	Message       string    `json:"message"`
	Time          time.Time `json:"time"`
	Version       string    `json:"version,omitempty"`
	FromRevision  uint64    `json:"from_revision,omitempty"`
	Raw           bool      `json:"raw,omitempty"`
	Deleted       bool      `json:"deleted,omitempty"`
	Diff          string    `json:"diff,omitempty"`
	Policy        *string   `json:"policy,omitempty"`
}

// toJSON converts r, with its policy when withPolicy is set.
func toJSON(r kvstore.Revision, withPolicy bool) *revisionJSON {
	out := &revisionJSON{
		Revision: r.Revision, Key: r.Key, Op: r.Op, Author: r.Author, ClaimedAuthor: r.ClaimedAuthor,
		Message: r.Message, Time: r.Time, Version: r.Version, FromRevision: r.FromRevision,
		Raw: r.Raw, Deleted: r.Deleted, Diff: r.Diff,
	}
	if withPolicy && !r.Deleted {
		s := string(r.Source)
		out.Policy = &s
	}
	return out
}

// ruleChangeJSON is one rule's change.
type ruleChangeJSON struct {
	Rule   string      `json:"rule"`
	Change string      `json:"change"`
	Fields []fieldJSON `json:"fields,omitempty"`
}

type fieldJSON struct {
	Field string `json:"field"`
	Old   string `json:"old"`
	New   string `json:"new"`
}

// ruleChanges compares two policies rule by rule; a policy that does not
// parse counts as empty.
func ruleChanges(from, to *policy.Set) []ruleChangeJSON {
	out := []ruleChangeJSON{}
	for _, c := range kvstore.RuleChanges(from, to) {
		rc := ruleChangeJSON{Rule: c.Rule, Change: c.Kind}
		for _, f := range c.Fields {
			rc.Fields = append(rc.Fields, fieldJSON(f))
		}
		out = append(out, rc)
	}
	return out
}

// setOf parses a revision's policy, nil when it has none or it does not
// parse.
func setOf(r kvstore.Revision) *policy.Set {
	if r.Revision == 0 || r.Deleted {
		return nil
	}
	s, err := r.Set()
	if err != nil {
		return nil
	}
	return s
}

// writeDiff prints a diff with its header and the rule changes under it.
func writeDiff(w io.Writer, from, to, diff string, changes []ruleChangeJSON) {
	if diff == "" {
		fmt.Fprintf(w, "no difference between %s and %s\n", from, to)
		return
	}
	fmt.Fprintf(w, "--- %s\n+++ %s\n%s", from, to, diff)
	if len(changes) > 0 {
		fmt.Fprintln(w)
	}
	for _, c := range changes {
		rc := kvstore.RuleChange{Rule: c.Rule, Kind: c.Change}
		for _, f := range c.Fields {
			rc.Fields = append(rc.Fields, kvstore.FieldChange(f))
		}
		fmt.Fprintln(w, rc)
	}
}

// describe names a revision for the text output.
func describe(r kvstore.Revision) string {
	if r.Revision == 0 {
		return "(no policy)"
	}
	s := "revision " + strconv.FormatUint(r.Revision, 10)
	if r.Key == kvstore.KeyStaged {
		s = "staged " + s
	}
	return s
}

// authorOf is a revision's author for the text output.
func authorOf(r kvstore.Revision) string {
	switch {
	case r.Author == "":
		return "(unknown)"
	case r.ClaimedAuthor != "":
		return r.Author + " (as " + r.ClaimedAuthor + ")"
	}
	return r.Author
}
