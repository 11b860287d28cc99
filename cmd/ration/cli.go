package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/ration-dev/ration/internal/natsauth"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/envoyimport"
	"github.com/ration-dev/ration/policy/kvstore"
)

// cli is one invocation: its flags, its output and its connection.
type cli struct {
	g              globals
	admin          adminFlags
	stdout, stderr io.Writer
	ctx            context.Context
	nc             *nats.Conn
	// closers release what the command opened besides nc (the admin
	// client's idle connections).
	closers []func()

	// The subcommands' own flags.
	message, author string
	shadow, verbose bool
	replicas, n     int
	file            string
	rule, by        string
}

func (c *cli) json() bool { return c.g.output == "json" }

func (c *cli) close() {
	if c.nc != nil {
		c.nc.Close()
	}
	for _, f := range c.closers {
		f()
	}
}

// usageError is a bad invocation: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

// exitCode is the exit status of an error: any error not otherwise
// classified is NATS's or the store's (3).
func exitCode(err error) int {
	var ue usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, kvstore.ErrInvalidConfig):
		return exitUsage
	case errors.Is(err, kvstore.ErrConflict):
		return exitConflict
	case errors.Is(err, policy.ErrInvalid), errors.Is(err, envoyimport.ErrInvalid), errors.Is(err, kvstore.ErrTooLarge), errors.Is(err, kvstore.ErrNoPolicy),
		errors.Is(err, kvstore.ErrNoStaged), errors.Is(err, kvstore.ErrNoRevision), errors.Is(err, kvstore.ErrFormat),
		errors.Is(err, kvstore.ErrUnchanged):
		return exitRefused
	}
	return exitUnreachable
}

// problemJSON is one problem of an invalid document.
type problemJSON struct {
	File    string `json:"file"`
	Line    int    `json:"line,omitempty"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

type errorJSON struct {
	Error    string        `json:"error"`
	Exit     int           `json:"exit"`
	Problems []problemJSON `json:"problems,omitempty"`
}

// fail reports err, on stderr or as JSON on stdout, and returns its exit
// status. The problems of an invalid document are listed one a line.
func (c *cli) fail(err error) int {
	code := exitCode(err)
	es, what, invalid := problems(err)
	msg := err.Error()
	if invalid {
		// The problems are listed apart; keep what the error says around
		// them.
		msg = strings.TrimSuffix(strings.TrimSuffix(msg, es.Error()), ": ")
		summary := fmt.Sprintf("%s: %d problem(s)", what, len(es))
		if msg == "" {
			msg = summary
		} else {
			msg += ": " + summary
		}
	}
	if c.json() {
		out := errorJSON{Error: msg, Exit: code}
		for _, e := range es {
			out.Problems = append(out.Problems, problemJSON{File: e.File, Line: e.Line, Field: e.Field, Message: e.Msg})
		}
		c.writeJSON(out)
		return code
	}
	for _, e := range es {
		fmt.Fprintln(c.stderr, e.Error())
	}
	fmt.Fprintln(c.stderr, "ration:", msg)
	return code
}

// problems returns the problems of an invalid policy, or of an Envoy
// configuration that cannot be converted, as policy.Errors, and what they
// are the problems of.
func problems(err error) (es policy.Errors, what string, ok bool) {
	if errors.As(err, &es) {
		return es, "invalid policy", true
	}
	var ee envoyimport.Errors
	if !errors.As(err, &ee) {
		return nil, "", false
	}
	for _, e := range ee {
		es = append(es, &policy.FieldError{File: e.File, Line: e.Line, Field: e.Field, Msg: e.Msg})
	}
	return es, "cannot convert", true
}

func (c *cli) writeJSON(v any) {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		fmt.Fprintln(c.stderr, "ration: writing JSON:", err)
	}
}

// emit prints a result: v as JSON, or text.
func (c *cli) emit(v any, text func(w io.Writer)) {
	if c.json() {
		c.writeJSON(v)
		return
	}
	text(c.stdout)
}

// readFile reads a policy file, at most one byte more than the store
// takes. An unreadable file is a usage error.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usageError{err.Error()}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, kvstore.MaxDocument+1))
	if err != nil {
		return nil, usageError{fmt.Sprintf("reading %s: %v", path, err)}
	}
	if len(data) > kvstore.MaxDocument {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes (1 MiB), the most the policy store takes", kvstore.ErrTooLarge, path, kvstore.MaxDocument)
	}
	return data, nil
}

// open connects to NATS and opens the store; create lets it create a
// missing bucket (with replicas copies).
func (c *cli) open(create bool, replicas int) (*kvstore.Store, error) {
	opts, err := c.natsOptions()
	if err != nil {
		return nil, usageError{err.Error()}
	}
	nc, err := nats.Connect(c.g.nats, append(opts, nats.Name("ration policy"), nats.NoReconnect(),
		nats.Timeout(min(c.g.timeout, 5*time.Second)))...)
	if err != nil {
		return nil, fmt.Errorf("nats %s: %w", c.g.nats, err)
	}
	c.nc = nc
	st, err := kvstore.Open(c.ctx, kvstore.Config{
		Conn: nc, Bucket: c.g.bucket, Replicas: replicas, NoCreate: !create,
		Logger: slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if errors.Is(err, kvstore.ErrNoPolicy) {
		return nil, fmt.Errorf("%w (ration policy push creates it)", err)
	}
	return st, err
}

// natsOptions are the TLS files' and credentials' options, as regiond's.
func (c *cli) natsOptions() ([]nats.Option, error) {
	g := c.g
	return natsauth.Options(natsauth.Files{CA: g.natsCA, Cert: g.natsCert, Key: g.natsKey, Creds: g.natsCreds, Nkey: g.natsNkey})
}

// meta is the Meta of a write: the author as identity resolves it, and
// -m.
func (c *cli) meta() kvstore.Meta {
	author, claimed := c.identity()
	return kvstore.Meta{Author: author, ClaimedAuthor: claimed, Message: c.message}
}

// identity resolves who writes: the NATS identity (with -author, when it
// differs, as the claimed author), else -author, else the OS user and
// host, unverified.
func (c *cli) identity() (author, claimed string) {
	id := c.natsIdentity()
	switch {
	case id != "" && c.author != "" && c.author != id:
		return id, c.author
	case id != "":
		return id, ""
	case c.author != "":
		return c.author, ""
	}
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		name += "@" + h
	}
	return name + " (unverified)", ""
}

// userInfo is nats-server's answer to $SYS.REQ.USER.INFO.
type userInfo struct {
	Data *struct {
		User        string `json:"user"`
		Account     string `json:"account"`
		AccountName string `json:"account_name"`
		UserName    string `json:"user_name"`
	} `json:"data"`
}

// natsIdentity is who the server authenticated this connection as: it
// asks the server ($SYS.REQ.USER.INFO), else reads the user from the
// credentials connected with. "" when the server authenticates no one.
func (c *cli) natsIdentity() string {
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
	defer cancel()
	if m, err := c.nc.RequestWithContext(ctx, "$SYS.REQ.USER.INFO", nil); err == nil {
		var ui userInfo
		if json.Unmarshal(m.Data, &ui) == nil && ui.Data != nil && ui.Data.User != "" {
			name := ui.Data.User
			if ui.Data.UserName != "" {
				name = ui.Data.UserName
			}
			acct := ui.Data.AccountName
			if acct == "" {
				acct = ui.Data.Account
			}
			if acct != "" && acct != "$G" {
				name += "@" + acct
			}
			return name
		}
	}
	switch {
	case c.g.natsCreds != "":
		data, err := os.ReadFile(c.g.natsCreds)
		if err != nil {
			return ""
		}
		tok, err := jwt.ParseDecoratedJWT(data)
		if err != nil {
			return ""
		}
		uc, err := jwt.DecodeUserClaims(tok)
		if err != nil {
			return ""
		}
		if uc.Name != "" {
			return uc.Name
		}
		return uc.Subject
	case c.g.natsNkey != "":
		data, err := os.ReadFile(c.g.natsNkey)
		if err != nil {
			return ""
		}
		kp, err := nkeys.ParseDecoratedNKey(data)
		if err != nil {
			return ""
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return ""
		}
		return pub
	}
	return ""
}
