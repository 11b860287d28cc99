// Command ration manages the policy every region enforces, kept versioned
// in a NATS JetStream key-value bucket (policy/kvstore): validate a file,
// push it, see what changed and who changed it, roll back, and stage a
// revision for the regions to evaluate in shadow before enforcing it. It
// also shows what the regions do, from regiond's admin API
// (internal/adminapi), asking every region given to -admin at once.
//
//	ration policy validate rules.yaml
//	ration policy push rules.yaml -m "raise acme to 2000/s"
//	ration policy history
//	ration policy rollback 12 -m "the raise overloads the ledger"
//	ration policy import-envoy ratelimit/config/ > rules.yaml
//	ration inspect per-tenant/acme -admin us:7071,eu:7071,ap:7071
//	ration top -by denied -n 20
//	ration status
//
// Every policy subcommand takes the global flags (-nats, -bucket, the TLS
// and credential files, -o, -timeout) before or after its arguments, and
// with -o json prints one JSON document on stdout, errors included. The
// author recorded with a revision is the NATS identity the server
// authenticated (with -author, when it differs, recorded beside it as
// claimed), else -author, else the OS user and host marked unverified.
//
// The operating commands (inspect, top, status) take -admin (default
// $RATION_ADMIN, else 127.0.0.1:7071), -admin-token-file
// ($RATION_ADMIN_TOKEN_FILE), -admin-ca ($RATION_ADMIN_CA; a host:port is
// then https), -admin-cert and -admin-key, -o and -timeout (5s unless
// given). They print what every region answered, and each failed region's
// error beside them (on stderr; with -o json in "errors", by address).
//
// Exit status:
//
//	0  success (a push that changes nothing included)
//	1  the document is invalid or too large, or the store refused the
//	   operation (no such revision, nothing staged); a region answered
//	   that it has no such key or rule; ration status: a region is not
//	   ready
//	2  usage: bad flags or arguments, a file that cannot be read
//	3  NATS or JetStream unreachable, or the store failed; a region's
//	   admin API could not be asked, refused the token, or failed (3
//	   wins over 1 when regions fail differently)
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

// command is a policy subcommand, or an operating command (admin).
type command struct {
	name, args, summary string
	// minArgs and maxArgs bound the positional arguments.
	minArgs, maxArgs int
	// admin marks the operating commands: they take the admin flags
	// rather than the NATS ones.
	admin bool
	// flags adds the subcommand's own flags.
	flags func(fs *flag.FlagSet, c *cli)
	// run carries it out; the positional arguments are checked.
	run func(c *cli, args []string) error
}

var commands = []*command{
	validateCmd, pushCmd, diffCmd, historyCmd, showCmd, rollbackCmd, promoteCmd, unstageCmd, importEnvoyCmd,
}

// adminCommands are the operating commands, on regiond's admin API.
var adminCommands = []*command{inspectCmd, topCmd, statusCmd}

func lookup(list []*command, name string) *command {
	i := slices.IndexFunc(list, func(c *command) bool { return c.name == name })
	if i < 0 {
		return nil
	}
	return list[i]
}

// run is the command: args without the program name. It returns the exit
// status.
func run(args []string, stdout, stderr io.Writer) int {
	c := &cli{g: defaultGlobals(), admin: defaultAdminFlags(), stdout: stdout, stderr: stderr}
	top := flag.NewFlagSet("ration", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	c.g.register(top)
	c.admin.register(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return exitOK
		}
		return c.fail(usageErrorf("%v", err))
	}
	set := map[string]bool{}
	top.Visit(func(f *flag.Flag) { set[f.Name] = true })
	args = top.Args()
	var cmd *command
	var name string
	switch {
	case len(args) == 0:
		usage(stderr)
		return exitUsage
	case args[0] == "help" || (args[0] == "policy" && len(args) > 1 && isHelp(args[1])):
		usage(stdout)
		return exitOK
	case args[0] == "policy" && len(args) == 1:
		return c.fail(usageErrorf("policy needs a subcommand (ration help lists them)"))
	case args[0] == "policy":
		if cmd = lookup(commands, args[1]); cmd == nil {
			return c.fail(usageErrorf("unknown subcommand %q (ration help lists them)", args[1]))
		}
		name, args = "policy "+cmd.name, args[2:]
	default:
		if cmd = lookup(adminCommands, args[0]); cmd == nil {
			return c.fail(usageErrorf("unknown command %q (ration help lists them)", args[0]))
		}
		name, args = cmd.name, args[1:]
	}
	// The flags before the command must be ones it takes.
	other := adminOnly
	if cmd.admin {
		other = natsOnly
	}
	for _, f := range other {
		if set[f] {
			return c.fail(usageErrorf("-%s does not apply to ration %s", f, name))
		}
	}
	if cmd.admin && !set["timeout"] {
		c.g.timeout = defaultAdminTTL
	}
	fs := flag.NewFlagSet("ration "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if cmd.admin {
		c.g.registerCommon(fs)
		c.admin.register(fs)
	} else {
		c.g.register(fs)
	}
	if cmd.flags != nil {
		cmd.flags(fs, c)
	}
	pos, err := parseInterleaved(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		commandUsage(stdout, name, cmd, fs)
		return exitOK
	case err != nil:
		return c.fail(usageErrorf("%v", err))
	case len(pos) < cmd.minArgs || len(pos) > cmd.maxArgs:
		return c.fail(usageErrorf("usage: ration %s %s", name, cmd.args))
	}
	if err := c.g.check(); err != nil {
		return c.fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.g.timeout)
	defer cancel()
	c.ctx = ctx
	defer c.close()
	if err := cmd.run(c, pos); err != nil {
		// An operating command has printed its output, errors included.
		if ee, ok := errors.AsType[exitError](err); ok {
			return ee.code
		}
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
	fmt.Fprint(w, `ration manages the policy every region enforces, kept in a NATS JetStream key-value bucket,
and shows what the regions do with it, from regiond's admin API.

Usage:
  ration policy <subcommand> [flags] [arguments]
  ration inspect|top|status [flags] [arguments]

Subcommands:
`)
	for _, c := range commands {
		listCommand(w, c)
	}
	fmt.Fprint(w, `
Operating commands (they ask every region of -admin at once):
`)
	for _, c := range adminCommands {
		listCommand(w, c)
	}
	g, a := defaultGlobals(), defaultAdminFlags()
	fmt.Fprint(w, `
Flags of the policy subcommands (before or after the arguments):
`)
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	fs.SetOutput(w)
	g.registerNATS(fs)
	fs.PrintDefaults()
	fmt.Fprint(w, `
Flags of the operating commands:
`)
	fs = flag.NewFlagSet("", flag.ContinueOnError)
	fs.SetOutput(w)
	a.register(fs)
	fs.PrintDefaults()
	fmt.Fprint(w, `
Flags of every command:
`)
	fs = flag.NewFlagSet("", flag.ContinueOnError)
	fs.SetOutput(w)
	g.registerCommon(fs)
	fs.PrintDefaults()
	fmt.Fprint(w, `
Exit status: 0 success (a push that changes nothing included); 1 the document
is invalid or too large, or the store refused (no such revision, nothing
staged), or a region answered that it has no such key or rule, or (status)
is not ready; 2 usage error or unreadable file; 3 NATS or the store
unreachable or failing, or a region's admin API could not be asked or
failed; 4 conflict (someone else wrote the policy meanwhile: retry).
The operating commands print what every region that answered said, and
the errors of the others; the exit status is the worst of them (3 over 1).

ration policy <subcommand> -h and ration <command> -h list a command's own flags.
`)
}

func listCommand(w io.Writer, c *command) {
	fmt.Fprintf(w, "  %s\n        %s\n", strings.TrimSpace(c.name+" "+c.args), c.summary)
}

func commandUsage(w io.Writer, name string, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: ration %s\n\n%s.\n\nFlags:\n", strings.TrimSpace(name+" "+cmd.args), upperFirst(cmd.summary))
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
	g.registerNATS(fs)
	g.registerCommon(fs)
}

// registerNATS adds the flags of the policy store.
func (g *globals) registerNATS(fs *flag.FlagSet) {
	fs.StringVar(&g.nats, "nats", g.nats, "NATS URL(s), comma-separated")
	fs.StringVar(&g.bucket, "bucket", g.bucket, "the policy's key-value bucket")
	fs.StringVar(&g.natsCA, "nats-ca", g.natsCA, "CA bundle (PEM) that verifies the NATS servers: connect over TLS")
	fs.StringVar(&g.natsCert, "nats-cert", g.natsCert, "client certificate (PEM) for NATS servers that verify clients")
	fs.StringVar(&g.natsKey, "nats-key", g.natsKey, "key (PEM) of -nats-cert")
	fs.StringVar(&g.natsCreds, "nats-creds", g.natsCreds, "NATS .creds file (user JWT and nkey seed) for a NATS in operator mode")
	fs.StringVar(&g.natsNkey, "nats-nkey", g.natsNkey, "file holding the seed of the NATS nkey user to connect as")
}

// registerCommon adds the flags every command takes.
func (g *globals) registerCommon(fs *flag.FlagSet) {
	fs.StringVar(&g.output, "o", g.output, "output: text or json")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "how long the whole command may take (inspect, top, status: 5s unless given)")
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
