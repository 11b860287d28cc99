package main

import (
	"fmt"
	"io"

	"github.com/ration-dev/ration/policy"
)

var validateCmd = &command{
	name: "validate", args: "FILE", minArgs: 1, maxArgs: 1,
	summary: "check a policy file, offline: every problem with its line and field",
	run:     runValidate,
}

type validateJSON struct {
	OK      bool   `json:"ok"`
	File    string `json:"file"`
	Rules   int    `json:"rules"`
	Version string `json:"version"`
}

func runValidate(c *cli, args []string) error {
	file := args[0]
	data, err := readFile(file)
	if err != nil {
		return err
	}
	set, err := policy.Parse(file, data)
	if err != nil {
		return err
	}
	c.emit(validateJSON{OK: true, File: file, Rules: len(set.Rules()), Version: set.Version()}, func(w io.Writer) {
		fmt.Fprintf(w, "ok: %d rules, version %s\n", len(set.Rules()), set.Version())
	})
	return nil
}
