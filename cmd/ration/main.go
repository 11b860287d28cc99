// Command ration manages the policy every region enforces, kept versioned
// in a NATS JetStream key-value bucket (policy/kvstore): validate a file,
// push it, see what changed and who changed it, roll back, and stage a
// revision for the regions to evaluate in shadow before enforcing it.
//
//	ration policy validate rules.yaml
//	ration policy push rules.yaml -m "raise acme to 2000/s"
//	ration policy history
//	ration policy rollback 12 -m "the raise overloads the ledger"
//
// Every subcommand takes the global flags (-nats, -bucket, the TLS and
// credential files, -o, -timeout) before or after its arguments, and with
// -o json prints one JSON document on stdout, errors included. The author
// recorded with a revision is the NATS identity the server authenticated
// (with -author, when it differs, recorded beside it as claimed), else
// -author, else the OS user and host marked unverified.
//
// Exit status:
//
//	0  success (a push that changes nothing included)
//	1  the document is invalid or too large, or the store refused the
//	   operation (no such revision, nothing staged)
//	2  usage: bad flags or arguments, a file that cannot be read
//	3  NATS or JetStream unreachable, or the store failed
//	4  conflict: someone else wrote the policy meanwhile; read it and retry
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ration-dev/ration/policy/kvstore"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK          = 0
	exitRefused     = 1
	exitUsage       = 2
	exitUnreachable = 3
	exitConflict    = 4
)

// command is a policy subcommand.
type command struct {
	name, args, summary string
	// minArgs and maxArgs bound the positional arguments.
	minArgs, maxArgs int
	// flags adds the subcommand's own flags.
	flags func(fs *flag.FlagSet, c *cli)
	// run carries it out; the positional arguments are checked.
	run func(c *cli, args []string) error
}

var commands = []*command{
	validateCmd, pushCmd, diffCmd, historyCmd, showCmd, rollbackCmd, promoteCmd, unstageCmd,
}

func lookup(name string) *command {
	i := slices.IndexFunc(commands, func(c *command) bool { return c.name == name })
	if i < 0 {
		return nil
	}
	return commands[i]
}

// run is the command: args without the program name. It returns the exit
// status.
func run(args []string, stdout, stderr io.Writer) int {
	c := &cli{g: defaultGlobals(), stdout: stdout, stderr: stderr}
	top := flag.NewFlagSet("ration", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	c.g.register(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return exitOK
		}
		return c.fail(usageErrorf("%v", err))
	}
	args = top.Args()
	switch {
	case len(args) == 0:
		usage(stderr)
		return exitUsage
	case args[0] == "help" || (args[0] == "policy" && len(args) > 1 && isHelp(args[1])):
		usage(stdout)
		return exitOK
	case args[0] != "policy":
		return c.fail(usageErrorf("unknown command %q (ration help lists them)", args[0]))
	case len(args) == 1:
		return c.fail(usageErrorf("policy needs a subcommand (ration help lists them)"))
	}
	cmd := lookup(args[1])
	if cmd == nil {
		return c.fail(usageErrorf("unknown subcommand %q (ration help lists them)", args[1]))
	}
	fs := flag.NewFlagSet("ration policy "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.g.register(fs)
	if cmd.flags != nil {
		cmd.flags(fs, c)
	}
	pos, err := parseInterleaved(fs, args[2:])
	switch {
	case errors.Is(err, flag.ErrHelp):
		commandUsage(stdout, cmd, fs)
		return exitOK
	case err != nil:
		return c.fail(usageErrorf("%v", err))
	case len(pos) < cmd.minArgs || len(pos) > cmd.maxArgs:
		return c.fail(usageErrorf("usage: ration policy %s %s", cmd.name, cmd.args))
	}
	if err := c.g.check(); err != nil {
		return c.fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.g.timeout)
	defer cancel()
	c.ctx = ctx
	defer c.close()
	if err := cmd.run(c, pos); err != nil {
		return c.fail(err)
	}
	return exitOK
}

func isHelp(arg string) bool {
	return arg == "help" || arg == "-h" || arg == "-help" || arg == "--help"
}

// parseInterleaved parses flags anywhere among the positional arguments,
// which it returns.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `ration manages the policy every region enforces, kept in a NATS JetStream key-value bucket.

Usage:
  ration policy <subcommand> [flags] [arguments]

Subcommands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %s %s\n        %s\n", c.name, c.args, c.summary)
	}
	fmt.Fprint(w, `
Global flags (before or after the arguments):
`)
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	fs.SetOutput(w)
	g := defaultGlobals()
	g.register(fs)
	fs.PrintDefaults()
	fmt.Fprint(w, `
Exit status: 0 success (a push that changes nothing included); 1 the document
is invalid or too large, or the store refused (no such revision, nothing
staged); 2 usage error or unreadable file; 3 NATS or the store unreachable or
failing; 4 conflict (someone else wrote the policy meanwhile: retry).

ration policy <subcommand> -h lists a subcommand's own flags.
`)
}

func commandUsage(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: ration policy %s %s\n\n%s.\n\nFlags:\n", cmd.name, cmd.args, upperFirst(cmd.summary))
	fs.SetOutput(w)
	fs.PrintDefaults()
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// globals are the flags every subcommand takes.
type globals struct {
	nats, bucket                         string
	natsCA, natsCert, natsKey, natsCreds string
	natsNkey                             string
	output                               string
	timeout                              time.Duration
}

func defaultGlobals() globals {
	return globals{nats: "nats://127.0.0.1:4222", bucket: kvstore.DefaultBucket, output: "text", timeout: 10 * time.Second}
}

// register adds the flags to fs, with g's values as their defaults: the
// subcommand's flag set keeps what the flags before the subcommand set.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.nats, "nats", g.nats, "NATS URL(s), comma-separated")
	fs.StringVar(&g.bucket, "bucket", g.bucket, "the policy's key-value bucket")
	fs.StringVar(&g.natsCA, "nats-ca", g.natsCA, "CA bundle (PEM) that verifies the NATS servers: connect over TLS")
	fs.StringVar(&g.natsCert, "nats-cert", g.natsCert, "client certificate (PEM) for NATS servers that verify clients")
	fs.StringVar(&g.natsKey, "nats-key", g.natsKey, "key (PEM) of -nats-cert")
	fs.StringVar(&g.natsCreds, "nats-creds", g.natsCreds, "NATS .creds file (user JWT and nkey seed) for a NATS in operator mode")
	fs.StringVar(&g.natsNkey, "nats-nkey", g.natsNkey, "file holding the seed of the NATS nkey user to connect as")
	fs.StringVar(&g.output, "o", g.output, "output: text or json")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "how long the whole command may take")
}

func (g *globals) check() error {
	switch {
	case g.output != "text" && g.output != "json":
		return usageErrorf("-o must be text or json (got %q)", g.output)
	case g.timeout <= 0:
		return usageErrorf("-timeout must be > 0 (got %v)", g.timeout)
	case g.natsCreds != "" && g.natsNkey != "":
		return usageErrorf("-nats-creds and -nats-nkey are exclusive")
	}
	return nil
}
