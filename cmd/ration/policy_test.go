package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nkeys"

	"github.com/ration-dev/ration/policy/kvstore"
	"github.com/ration-dev/ration/sync/embedded"
)

// revisions is the history's revision numbers, newest first.
func revisions(e *env) []float64 {
	e.t.Helper()
	var out []float64
	for _, r := range e.json(exitOK, "policy", "history")["revisions"].([]any) {
		out = append(out, r.(map[string]any)["revision"].(float64))
	}
	return out
}

// TestPolicyLifecycle walks every subcommand through a policy's life:
// pushes, a refused file, a refused huge file, history, show, diff,
// staging, promoting, unstaging and rolling back.
func TestPolicyLifecycle(t *testing.T) {
	e := newEnv(t, embedded.Config{})
	v1, v2, v3, v4 := e.file("v1.yaml", doc(10)), e.file("v2.yaml", doc(20)), e.file("v3.yaml", doc(30)), e.file("v4.yaml", doc(40))

	// Nothing yet: reading commands do not create the bucket.
	if _, errOut, code := e.ration("policy", "show"); code != exitRefused || !strings.Contains(errOut, "does not exist (ration policy push creates it)") {
		t.Fatalf("show before any push: exit %d, %s", code, errOut)
	}

	out := e.must("policy", "push", v1, "-m", "first", "-author", "alice")
	contains(t, "push", out, "--- enforced (no policy)\n+++ "+v1+"\n@@ -0,0 +1,4 @@\n+rules:\n", "+ per-tenant\n", "pushed: revision 1 enforces version ", ", by alice")
	if out := e.must("policy", "push", v1); !strings.HasPrefix(out, "no change: revision 1 already has version ") {
		t.Errorf("pushing the same file: %q", out)
	}
	v := e.json(exitOK, "policy", "push", v2, "-m", "raise", "-author", "alice")
	rev := v["revision"].(map[string]any)
	if rev["revision"] != float64(2) || v["previous_revision"] != float64(1) || rev["op"] != "push" || rev["message"] != "raise" {
		t.Errorf("push -o json: %v", v)
	}
	wantChanges := []any{map[string]any{"rule": "per-tenant", "change": "changed", "fields": []any{
		map[string]any{"field": "limit", "old": "10", "new": "20"},
		map[string]any{"field": "burst", "old": "10", "new": "20"},
	}}}
	if d := cmp.Diff(wantChanges, v["rule_changes"]); d != "" {
		t.Errorf("rule changes (-want +got):\n%s", d)
	}

	// A bad file and a huge one are refused and write nothing.
	_, errOut, code := e.ration("policy", "push", e.file("bad.yaml", badDoc))
	if code != exitRefused || !strings.Contains(errOut, "rules[0].limit: must be > 0") {
		t.Errorf("pushing a bad file: exit %d, %s", code, errOut)
	}
	huge := e.file("huge.yaml", doc(50)+strings.Repeat("# padding padding padding padding\n", kvstore.MaxDocument/30))
	_, errOut, code = e.ration("policy", "push", huge)
	if code != exitRefused || !strings.Contains(errOut, "1 MiB") {
		t.Errorf("pushing a huge file: exit %d, %s", code, errOut)
	}
	if got := revisions(e); !cmp.Equal(got, []float64{2, 1}) {
		t.Errorf("after refused pushes the revisions are %v, want [2 1]", got)
	}

	// history, show, diff.
	out = e.must("policy", "history")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "REV") || !strings.HasPrefix(lines[1], "2 ") || !strings.Contains(lines[1], "raise") || !strings.Contains(lines[2], "alice") {
		t.Errorf("history:\n%s", out)
	}
	contains(t, "history -v", e.must("policy", "history", "-v", "-n", "1"), "revision 2  ", "    raise\n", "-    limit: 10\n+    limit: 20\n")
	if h := e.json(exitOK, "policy", "history", "-n", "1")["revisions"].([]any); len(h) != 1 || !strings.Contains(h[0].(map[string]any)["diff"].(string), "+    limit: 20") {
		t.Errorf("history -o json -n 1: %v", h)
	}
	if out := e.must("policy", "show"); out != doc(20) {
		t.Errorf("show: %q, want v2", out)
	}
	if out := e.must("policy", "show", "1"); out != doc(10) {
		t.Errorf("show 1: %q, want v1", out)
	}
	if v := e.json(exitOK, "policy", "show"); v["policy"] != doc(20) || v["author"] != "alice" || v["revision"] != float64(2) {
		t.Errorf("show -o json: %v", v)
	}
	if _, _, code := e.ration("policy", "show", "99"); code != exitRefused {
		t.Errorf("show 99: exit %d", code)
	}
	out = e.must("policy", "diff")
	contains(t, "diff", out, "--- enforced revision 2\n+++ revision 1\n", "-    limit: 20\n+    limit: 10\n", "~ per-tenant: limit 20 -> 10")
	contains(t, "diff -file", e.must("policy", "diff", "-file", v3), "+++ "+v3+"\n", "+    limit: 30\n")
	if out := e.must("policy", "diff", "2"); out != "no difference between enforced revision 2 and revision 2\n" {
		t.Errorf("diff 2: %q", out)
	}

	// Stage, promote, unstage.
	out = e.must("policy", "push", v3, "-shadow", "-m", "try 30")
	contains(t, "push -shadow", out, "staged: revision 3", "revision 2 stays enforced")
	if out := e.must("policy", "show", "staged"); out != doc(30) {
		t.Errorf("show staged: %q", out)
	}
	contains(t, "diff with a staged revision", e.must("policy", "diff"), "+++ staged revision 3\n", "+    limit: 30\n")
	if v := e.json(exitOK, "policy", "diff", "staged"); v["to"].(map[string]any)["key"] != "staged" || !strings.Contains(v["diff"].(string), "+    limit: 30") {
		t.Errorf("diff staged -o json: %v", v)
	}
	contains(t, "promote", e.must("policy", "promote"), "promoted: staged revision 3 is enforced as revision 4")
	if out := e.must("policy", "show"); out != doc(30) {
		t.Errorf("show after promote: %q", out)
	}
	if _, errOut, code := e.ration("policy", "promote"); code != exitRefused || !strings.Contains(errOut, "no staged policy") {
		t.Errorf("promote with nothing staged: exit %d, %s", code, errOut)
	}
	e.must("policy", "push", v4, "-shadow")
	contains(t, "unstage", e.must("policy", "unstage", "-m", "no"), "unstaged: staged revision 6 removed")
	if _, _, code := e.ration("policy", "unstage"); code != exitRefused {
		t.Errorf("unstage with nothing staged: exit %d", code)
	}
	if out := e.must("policy", "show"); out != doc(30) {
		t.Errorf("unstage changed the enforced policy: %q", out)
	}

	// Rollback restores the old YAML.
	out = e.must("policy", "rollback", "1", "-m", "back")
	contains(t, "rollback", out, "-    limit: 30\n+    limit: 10\n", "rolled back: revision 8 enforces revision 1's policy")
	if out := e.must("policy", "show"); out != doc(10) {
		t.Errorf("show after rollback: %q, want v1's YAML", out)
	}
	if out := e.must("policy", "rollback", "1"); !strings.HasPrefix(out, "no change: revision 8") {
		t.Errorf("rolling back to the enforced policy: %q", out)
	}
	if _, _, code := e.ration("policy", "rollback", "999"); code != exitRefused {
		t.Errorf("rollback 999: exit %d", code)
	}
	ops := e.must("policy", "history")
	contains(t, "history", ops, "rollback 1", "unstage 6", "promote 3", "stage")
}

// TestJSONErrors: with -o json, an error is one JSON document on stdout
// and nothing is on stderr.
func TestJSONErrors(t *testing.T) {
	e := newEnv(t, embedded.Config{})
	out, errOut, code := e.ration("policy", "push", e.file("bad.yaml", badDoc), "-o", "json")
	if code != exitRefused || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	want := `{
  "error": "invalid policy: 2 problem(s)",
  "exit": 1,
  "problems": [
    {
      "file": "` + e.dir + `/bad.yaml",
      "line": 4,
      "field": "rules[0].limit",
      "message": "must be > 0"
    },
    {
      "file": "` + e.dir + `/bad.yaml",
      "line": 5,
      "field": "rules[1].name",
      "message": "must match [a-z0-9][a-z0-9._-]* (got \"Bad Name\")"
    }
  ]
}
`
	if out != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", out, want)
	}
	if v := e.json(exitRefused, "policy", "show"); !strings.Contains(v["error"].(string), "does not exist") {
		t.Errorf("show on no bucket: %v", v)
	}
}

// TestAuthor records the NATS identity the server authenticated, with a
// different -author beside it as claimed; without authentication, -author,
// else the OS user, unverified.
func TestAuthor(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "writer.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	writer := func(u embedded.User) embedded.User {
		u.Publish, u.Subscribe = []string{}, []string{}
		return u.Allow(embedded.PolicyWriter(kvstore.DefaultBucket))
	}
	e := newEnv(t, embedded.Config{Users: []embedded.User{
		writer(embedded.User{Name: "cli", Password: "pw"}),
		writer(embedded.User{Name: "nkey-writer", Nkey: pub}),
	}})
	authURL := strings.Replace(e.url, "nats://", "nats://cli:pw@", 1)

	author := func(args ...string) (string, string) {
		t.Helper()
		v := e.json(exitOK, append([]string{"policy", "show"}, args...)...)
		claimed, _ := v["claimed_author"].(string)
		return v["author"].(string), claimed
	}
	e.must("policy", "push", e.file("a.yaml", doc(1)), "-nats", authURL, "-author", "bob")
	if a, c := author("-nats", authURL); a != "cli" || c != "bob" {
		t.Errorf("password user with -author bob: author %q, claimed %q; want cli, bob", a, c)
	}
	e.must("policy", "push", e.file("b.yaml", doc(2)), "-nats-nkey", seedFile, "-author", pub)
	if a, c := author("-nats-nkey", seedFile); a != pub || c != "" {
		t.Errorf("nkey user with -author its own key: author %q, claimed %q; want %s alone", a, c, pub)
	}
	if _, errOut, code := e.ration("policy", "show"); code != exitUnreachable {
		t.Errorf("no credentials: exit %d (%s), want %d", code, errOut, exitUnreachable)
	}

	open := newEnv(t, embedded.Config{})
	open.must("policy", "push", open.file("a.yaml", doc(1)), "-author", "zed")
	open.must("policy", "push", open.file("b.yaml", doc(2)))
	h := open.json(exitOK, "policy", "history")["revisions"].([]any)
	if got := h[1].(map[string]any)["author"]; got != "zed" {
		t.Errorf("-author on a server without authentication: %v, want zed", got)
	}
	if got := h[0].(map[string]any)["author"].(string); !strings.HasSuffix(got, " (unverified)") {
		t.Errorf("no -author, no authentication: %q, want the OS user, unverified", got)
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{usageErrorf("x"), exitUsage},
		{fmt.Errorf("push: %w", kvstore.ErrConflict), exitConflict},
		{fmt.Errorf("%w: big", kvstore.ErrTooLarge), exitRefused},
		{kvstore.ErrNoStaged, exitRefused},
		{kvstore.ErrInvalidConfig, exitUsage},
		{errors.New("nats: timeout"), exitUnreachable},
	} {
		if got := exitCode(tc.err); got != tc.want {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// TestReplicasFlag: a push that creates the bucket takes -replicas; a
// single server cannot hold three copies, and says so.
func TestReplicasFlag(t *testing.T) {
	e := newEnv(t, embedded.Config{})
	_, errOut, code := e.ration("policy", "push", e.file("a.yaml", doc(1)), "-replicas", "3")
	if code != exitUnreachable || !strings.Contains(errOut, "creating bucket") {
		t.Errorf("-replicas 3 on one server: exit %d, %s", code, errOut)
	}
	if _, errOut, code := e.ration("policy", "push", e.file("a.yaml", doc(1)), "-replicas", "9"); code != exitUsage {
		t.Errorf("-replicas 9: exit %d (%s), want %d", code, errOut, exitUsage)
	}
	var buf bytes.Buffer
	if code := run([]string{"-nats", e.url, "policy", "push", e.file("a.yaml", doc(1))}, &buf, &buf); code != exitOK {
		t.Errorf("push: exit %d\n%s", code, buf.String())
	}
}
