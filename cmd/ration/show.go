package main

import (
	"io"

	"github.com/ration-dev/ration/policy/kvstore"
)

var showCmd = &command{
	name: "show", args: "[REV|staged]", minArgs: 0, maxArgs: 1,
	summary: "print the enforced policy's YAML, or REV's (JSON: with its metadata)",
	run:     runShow,
}

func runShow(c *cli, args []string) error {
	rev, err := revArg(args)
	if err != nil {
		return err
	}
	st, err := c.open(false, 0)
	if err != nil {
		return err
	}
	var r kvstore.Revision
	switch rev {
	case 0:
		r, err = st.Current(c.ctx)
	case stagedRev:
		r, err = st.Staged(c.ctx)
	default:
		r, err = st.Get(c.ctx, rev)
	}
	if err != nil {
		return err
	}
	c.emit(toJSON(r, true), func(w io.Writer) { _, _ = w.Write(r.Source) })
	return nil
}
