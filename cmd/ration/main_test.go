package main

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/ration-dev/ration/sync/embedded"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is an embedded JetStream server and a directory for policy files.
type env struct {
	t   *testing.T
	url string
	dir string
}

func newEnv(t *testing.T, cfg embedded.Config) *env {
	t.Helper()
	cfg.JetStream = true
	s, err := embedded.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &env{t: t, url: s.ClientURL(), dir: t.TempDir()}
}

// ration runs the command against the server (its URL as -nats first, so
// that a test may give another).
func (e *env) ration(args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	return ration(e.t, append([]string{"-nats", e.url}, args...)...)
}

func ration(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, s bytes.Buffer
	code = run(args, &o, &s)
	return o.String(), s.String(), code
}

// must runs the command, which must succeed, and returns its stdout.
func (e *env) must(args ...string) string {
	e.t.Helper()
	out, errOut, code := e.ration(args...)
	if code != exitOK {
		e.t.Fatalf("ration %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// json runs the command with -o json and decodes its one document.
func (e *env) json(want int, args ...string) map[string]any {
	e.t.Helper()
	out, errOut, code := e.ration(append(args, "-o", "json")...)
	if code != want {
		e.t.Fatalf("ration %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, errOut)
	}
	var v map[string]any
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&v); err != nil {
		e.t.Fatalf("ration %s -o json: %v\n%s", strings.Join(args, " "), err, out)
	}
	if dec.More() {
		e.t.Fatalf("ration %s -o json printed more than one document:\n%s", strings.Join(args, " "), out)
	}
	return v
}

// file writes a policy file and returns its path.
func (e *env) file(name, content string) string {
	e.t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func doc(limit int) string {
	return "rules:\n  - name: per-tenant\n    key: [tenant]\n    limit: " + strconv.Itoa(limit) + "\n"
}

const badDoc = `rules:
  - name: per-tenant
    key: [tenant]
    limit: -1
  - name: Bad Name
    key: [ip]
    limit: 5
`

// closedURL is a loopback URL no server listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "nats://" + addr
}

func contains(t *testing.T, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("%s lacks %q:\n%s", what, sub, s)
		}
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{nil, exitUsage, "", "Usage:"},
		{[]string{"help"}, exitOK, "Exit status", ""},
		{[]string{"-h"}, exitOK, "Subcommands:", ""},
		{[]string{"policy", "help"}, exitOK, "rollback REV", ""},
		{[]string{"policy", "push", "-h"}, exitOK, "-shadow", ""},
		{[]string{"nope"}, exitUsage, "", `unknown command "nope"`},
		{[]string{"policy"}, exitUsage, "", "needs a subcommand"},
		{[]string{"policy", "nope"}, exitUsage, "", `unknown subcommand "nope"`},
		{[]string{"policy", "push"}, exitUsage, "", "usage: ration policy push FILE"},
		{[]string{"policy", "validate", "a", "b"}, exitUsage, "", "usage: ration policy validate FILE"},
		{[]string{"policy", "history", "-bogus"}, exitUsage, "", "flag provided but not defined: -bogus"},
		{[]string{"policy", "show", "-o", "yaml"}, exitUsage, "", "-o must be text or json"},
		{[]string{"policy", "show", "-timeout", "0s"}, exitUsage, "", "-timeout must be > 0"},
		{[]string{"policy", "show", "x"}, exitUsage, "", "REV must be a revision number or staged"},
		{[]string{"policy", "rollback", "staged"}, exitUsage, "", "REV must be a revision number"},
		{[]string{"policy", "history", "-n", "-1"}, exitUsage, "", "-n must be >= 0"},
		{[]string{"policy", "validate", "/does/not/exist.yaml"}, exitUsage, "", "no such file"},
		{[]string{"policy", "diff", "3", "-file", "x.yaml"}, exitUsage, "", "exclusive"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errOut, code := ration(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errOut)
			}
			contains(t, "stdout", out, tc.stdout)
			contains(t, "stderr", errOut, tc.stderr)
		})
	}
	// Usage errors are JSON with -o json.
	out, _, code := ration(t, "-o", "json", "policy", "nope")
	if code != exitUsage || !strings.Contains(out, `"exit": 2`) {
		t.Errorf("a usage error with -o json: exit %d, stdout %s", code, out)
	}
}

// TestValidate needs no NATS: -nats points where no server listens.
func TestValidate(t *testing.T) {
	e := &env{t: t, url: closedURL(t), dir: t.TempDir()}
	good, bad := e.file("good.yaml", doc(10)), e.file("bad.yaml", badDoc)
	out := e.must("policy", "validate", good)
	if !strings.HasPrefix(out, "ok: 1 rules, version ") {
		t.Errorf("validate: %q", out)
	}
	v := e.json(exitOK, "policy", "validate", good)
	if v["ok"] != true || v["rules"] != float64(1) || v["version"] == "" {
		t.Errorf("validate -o json: %v", v)
	}

	out, errOut, code := e.ration("policy", "validate", bad)
	if code != exitRefused || out != "" {
		t.Fatalf("validate of a bad file: exit %d, stdout %q", code, out)
	}
	want := bad + ":4: rules[0].limit: must be > 0\n" +
		bad + ":5: rules[1].name: must match [a-z0-9][a-z0-9._-]* (got \"Bad Name\")\n" +
		"ration: invalid policy: 2 problem(s)\n"
	if errOut != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", errOut, want)
	}
	v = e.json(exitRefused, "policy", "validate", bad)
	probs, _ := v["problems"].([]any)
	if len(probs) != 2 {
		t.Fatalf("problems: %v", v)
	}
	p0 := probs[0].(map[string]any)
	if p0["file"] != bad || p0["line"] != float64(4) || p0["field"] != "rules[0].limit" || p0["message"] != "must be > 0" {
		t.Errorf("first problem: %v", p0)
	}
}

func TestUnreachable(t *testing.T) {
	url := closedURL(t)
	for _, args := range [][]string{
		{"policy", "show"},
		{"policy", "history"},
		{"policy", "push", filepath.Join("..", "..", "policy", "testdata", "example.yaml")},
	} {
		_, errOut, code := ration(t, append(args, "-nats", url)...)
		if code != exitUnreachable || !strings.Contains(errOut, "no servers available") {
			t.Errorf("%v: exit %d, stderr %q; want %d", args, code, errOut, exitUnreachable)
		}
	}
	out, _, code := ration(t, "policy", "show", "-nats", url, "-o", "json")
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != exitUnreachable || v["exit"] != float64(exitUnreachable) {
		t.Errorf("-o json: exit %d, %s", code, out)
	}
}

// TestNoJetStream is a server without JetStream: the store cannot be
// reached.
func TestNoJetStream(t *testing.T) {
	s, err := embedded.Start(embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, errOut, code := ration(t, "policy", "show", "-nats", s.ClientURL(), "-timeout", "2s"); code != exitUnreachable {
		t.Errorf("exit %d (%s), want %d", code, errOut, exitUnreachable)
	}
}
