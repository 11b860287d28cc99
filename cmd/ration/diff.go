package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/kvstore"
)

var diffCmd = &command{
	name: "diff", args: "[REV|staged] [-file FILE]", minArgs: 0, maxArgs: 1,
	summary: "what would change if REV (default: the staged revision, else the one before the enforced one) or -file were enforced instead",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.StringVar(&c.file, "file", "", "a local policy file to compare the enforced revision with, before pushing it")
	},
	run: runDiff,
}

type diffJSON struct {
	From        *revisionJSON    `json:"from"`
	To          *revisionJSON    `json:"to,omitempty"`
	File        string           `json:"file,omitempty"`
	Diff        string           `json:"diff"`
	RuleChanges []ruleChangeJSON `json:"rule_changes"`
}

func runDiff(c *cli, args []string) error {
	if c.file != "" && len(args) > 0 {
		return usageErrorf("REV and -file are exclusive")
	}
	var data []byte
	var set *policy.Set
	if c.file != "" {
		var err error
		if data, err = readFile(c.file); err != nil {
			return err
		}
		if set, err = policy.Parse(c.file, data); err != nil {
			return err
		}
	}
	rev, err := revArg(args)
	if err != nil {
		return err
	}
	st, err := c.open(false, 0)
	if err != nil {
		return err
	}
	cur, err := st.Current(c.ctx)
	if err != nil && (c.file == "" || !errors.Is(err, kvstore.ErrNoPolicy)) {
		return err
	}
	out := diffJSON{From: toJSON(cur, false)}
	name := c.file
	if c.file == "" {
		to, err := diffTarget(c, st, cur, rev)
		if err != nil {
			return err
		}
		data, set, name = to.Source, setOf(to), describe(to)
		out.To = toJSON(to, false)
	} else {
		out.File = c.file
	}
	out.Diff = kvstore.Diff(cur.Source, data)
	out.RuleChanges = ruleChanges(setOf(cur), set)
	c.emit(out, func(w io.Writer) {
		writeDiff(w, "enforced "+describe(cur), name, out.Diff, out.RuleChanges)
	})
	return nil
}

// revArg parses an optional REV argument: a revision number, or "staged"
// (stagedRev), or none (0).
func revArg(args []string) (uint64, error) {
	if len(args) == 0 {
		return 0, nil
	}
	if args[0] == "staged" {
		return stagedRev, nil
	}
	rev, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil || rev == 0 {
		return 0, usageErrorf("REV must be a revision number or staged (got %q)", args[0])
	}
	return rev, nil
}

// stagedRev stands for "the staged revision" among revision numbers.
const stagedRev = ^uint64(0)

// diffTarget is the revision diff compares the enforced one with: rev,
// the staged one, or by default the staged one if any, else the enforced
// revision before cur.
func diffTarget(c *cli, st *kvstore.Store, cur kvstore.Revision, rev uint64) (kvstore.Revision, error) {
	switch rev {
	case stagedRev:
		return st.Staged(c.ctx)
	case 0:
	default:
		return st.Get(c.ctx, rev)
	}
	staged, err := st.Staged(c.ctx)
	if !errors.Is(err, kvstore.ErrNoStaged) {
		return staged, err
	}
	hist, err := st.History(c.ctx)
	if err != nil {
		return kvstore.Revision{}, err
	}
	for i := len(hist) - 1; i >= 0; i-- {
		if r := hist[i]; r.Key == kvstore.KeyEnforced && !r.Deleted && r.Revision < cur.Revision && r.Op != kvstore.OpUnreadable {
			return r, nil
		}
	}
	return kvstore.Revision{}, fmt.Errorf("%w: nothing is staged, and the bucket keeps no enforced revision before %d", kvstore.ErrNoRevision, cur.Revision)
}
