package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/kvstore"
)

var pushCmd = &command{
	name: "push", args: "FILE [-m MESSAGE] [-author NAME] [-shadow] [-replicas N]", minArgs: 1, maxArgs: 1,
	summary: "validate a policy file and enforce it as a new revision (-shadow: stage it)",
	flags: func(fs *flag.FlagSet, c *cli) {
		writeFlags(fs, c)
		fs.BoolVar(&c.shadow, "shadow", false, "stage the policy for the regions to evaluate in shadow, not enforce it (ration policy promote enforces it)")
		fs.IntVar(&c.replicas, "replicas", 1, "copies JetStream keeps of the bucket, if this push creates it (3 on a three-node cluster)")
	},
	run: runPush,
}

// writeFlags are the flags of every subcommand that writes.
func writeFlags(fs *flag.FlagSet, c *cli) {
	fs.StringVar(&c.message, "m", "", "why, recorded with the revision")
	fs.StringVar(&c.author, "author", "", "who, recorded as the author when NATS does not authenticate you (else as claimed, beside your NATS identity)")
}

// writeJSON is the JSON output of a write.
type writeJSON struct {
	Unchanged   bool             `json:"unchanged,omitempty"`
	Revision    *revisionJSON    `json:"revision"`
	Previous    uint64           `json:"previous_revision,omitempty"`
	RuleChanges []ruleChangeJSON `json:"rule_changes"`
}

func runPush(c *cli, args []string) error {
	file := args[0]
	data, err := readFile(file)
	if err != nil {
		return err
	}
	set, err := policy.Parse(file, data)
	if err != nil {
		return err
	}
	st, err := c.open(true, c.replicas)
	if err != nil {
		return err
	}
	before, err := current(c, st)
	if err != nil {
		return err
	}
	m := c.meta()
	m.Shadow = c.shadow
	r, err := st.Push(c.ctx, data, m)
	if errors.Is(err, kvstore.ErrUnchanged) {
		c.unchanged(r)
		return nil
	}
	if err != nil {
		return err
	}
	changes := ruleChanges(setOf(before), set)
	c.emit(writeJSON{Revision: toJSON(r, false), Previous: before.Revision, RuleChanges: changes}, func(w io.Writer) {
		writeWriteDiff(w, before, file, r, changes)
		if c.shadow {
			fmt.Fprintf(w, "staged: revision %d (version %s), by %s; %s stays enforced until ration policy promote\n",
				r.Revision, r.Version, authorOf(r), describe(before))
			return
		}
		fmt.Fprintf(w, "pushed: revision %d enforces version %s, by %s\n", r.Revision, r.Version, authorOf(r))
	})
	return nil
}

// current is the enforced revision, the zero Revision when there is none
// or it cannot be read as an envelope.
func current(c *cli, st *kvstore.Store) (kvstore.Revision, error) {
	r, err := st.Current(c.ctx)
	if errors.Is(err, kvstore.ErrNoPolicy) || errors.Is(err, kvstore.ErrFormat) {
		return kvstore.Revision{}, nil
	}
	return r, err
}

// unchanged reports a write that changed nothing: r holds the policy
// already.
func (c *cli) unchanged(r kvstore.Revision) {
	c.emit(writeJSON{Unchanged: true, Revision: toJSON(r, false), RuleChanges: []ruleChangeJSON{}}, func(w io.Writer) {
		fmt.Fprintf(w, "no change: %s already has version %s\n", describe(r), setOf(r).Version())
	})
}

// writeWriteDiff prints what a write changed: the revision's diff against
// the enforced one before it.
func writeWriteDiff(w io.Writer, before kvstore.Revision, to string, r kvstore.Revision, changes []ruleChangeJSON) {
	if r.Diff == "" {
		fmt.Fprintln(w, "(the diff is too large to keep with the revision)")
		return
	}
	writeDiff(w, "enforced "+describe(before), to, r.Diff, changes)
	fmt.Fprintln(w)
}
