package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/ration-dev/ration/policy/kvstore"
)

var rollbackCmd = &command{
	name: "rollback", args: "REV [-m MESSAGE] [-author NAME]", minArgs: 1, maxArgs: 1,
	summary: "enforce revision REV's policy again, as a new revision",
	flags:   writeFlags,
	run:     runRollback,
}

var promoteCmd = &command{
	name: "promote", args: "[-m MESSAGE] [-author NAME]", minArgs: 0, maxArgs: 0,
	summary: "enforce the staged policy, as a new revision, and unstage it",
	flags:   writeFlags,
	run:     runPromote,
}

var unstageCmd = &command{
	name: "unstage", args: "[-m MESSAGE] [-author NAME]", minArgs: 0, maxArgs: 0,
	summary: "remove the staged policy without enforcing it",
	flags:   writeFlags,
	run:     runUnstage,
}

func runRollback(c *cli, args []string) error {
	rev, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil || rev == 0 {
		return usageErrorf("REV must be a revision number (got %q)", args[0])
	}
	return c.enforce(true, func(st *kvstore.Store) (kvstore.Revision, error) {
		return st.Rollback(c.ctx, rev, c.meta())
	}, func(w io.Writer, r kvstore.Revision) {
		fmt.Fprintf(w, "rolled back: revision %d enforces revision %d's policy (version %s), by %s\n", r.Revision, rev, r.Version, authorOf(r))
	})
}

func runPromote(c *cli, _ []string) error {
	return c.enforce(false, func(st *kvstore.Store) (kvstore.Revision, error) {
		return st.Promote(c.ctx, c.meta())
	}, func(w io.Writer, r kvstore.Revision) {
		fmt.Fprintf(w, "promoted: staged revision %d is enforced as revision %d (version %s), by %s\n", r.FromRevision, r.Revision, r.Version, authorOf(r))
	})
}

// enforce runs a write of the enforced key and prints its diff, its rule
// changes and done's summary. With unchangedOK, a write that would change
// nothing is reported as such with status 0 (a rollback to the enforced
// policy); else it fails (a promote of a staged policy that is already
// enforced, which stays staged).
func (c *cli) enforce(unchangedOK bool, write func(*kvstore.Store) (kvstore.Revision, error), done func(io.Writer, kvstore.Revision)) error {
	st, err := c.open(false, 0)
	if err != nil {
		return err
	}
	before, err := current(c, st)
	if err != nil {
		return err
	}
	r, err := write(st)
	if unchangedOK && errors.Is(err, kvstore.ErrUnchanged) {
		c.unchanged(r)
		return nil
	}
	if err != nil {
		return err
	}
	changes := ruleChanges(setOf(before), setOf(r))
	c.emit(writeJSON{Revision: toJSON(r, false), Previous: before.Revision, RuleChanges: changes}, func(w io.Writer) {
		writeWriteDiff(w, before, describe(r), r, changes)
		done(w, r)
	})
	return nil
}

func runUnstage(c *cli, _ []string) error {
	st, err := c.open(false, 0)
	if err != nil {
		return err
	}
	r, err := st.Unstage(c.ctx, c.meta())
	if err != nil {
		return err
	}
	c.emit(writeJSON{Revision: toJSON(r, false), RuleChanges: []ruleChangeJSON{}}, func(w io.Writer) {
		fmt.Fprintf(w, "unstaged: staged revision %d removed, unenforced (revision %d), by %s\n", r.FromRevision, r.Revision, authorOf(r))
	})
	return nil
}
