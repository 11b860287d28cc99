package kvstore

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/sync/embedded"
)

var alice = Meta{Author: "alice", Message: "first"}

func mustPush(t *testing.T, st *Store, d []byte, m Meta) Revision {
	t.Helper()
	r, err := st.Push(testCtx(t), d, m)
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	return r
}

func history(t *testing.T, st *Store) []Revision {
	t.Helper()
	h, err := st.History(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// brief is what the tests compare of a revision.
type brief struct {
	Key     string
	Op      string
	Author  string
	Claimed string
	Message string
	From    uint64
	Deleted bool
	Raw     bool
	Source  string
}

func briefOf(r Revision) brief {
	return brief{r.Key, r.Op, r.Author, r.ClaimedAuthor, r.Message, r.FromRevision, r.Deleted, r.Raw, string(r.Source)}
}

func briefs(rs []Revision) []brief {
	out := make([]brief, len(rs))
	for i, r := range rs {
		out[i] = briefOf(r)
	}
	return out
}

func TestConfigValidate(t *testing.T) {
	nc := connect(t, startServer(t, embedded.Config{}).ClientURL())
	for _, c := range []Config{
		{},
		{Conn: nc, Bucket: "bad name"},
		{Conn: nc, Bucket: "a.b"},
		{Conn: nc, Replicas: 6},
		{Conn: nc, Replicas: -1},
	} {
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Validate(%+v): got %v, want ErrInvalidConfig", c, err)
		}
		if _, err := Open(testCtx(t), c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Open(%+v): got %v, want ErrInvalidConfig", c, err)
		}
	}
	if err := (Config{Conn: nc}).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

func TestOpenCreatesTheBucket(t *testing.T) {
	ctx := testCtx(t)
	nc := connect(t, startServer(t, embedded.Config{}).ClientURL())
	if _, err := Open(ctx, Config{Conn: nc, NoCreate: true, Logger: quiet}); !errors.Is(err, ErrNoPolicy) {
		t.Fatalf("NoCreate on a missing bucket: got %v, want ErrNoPolicy", err)
	}
	st := open(t, ctx, nc)
	status, err := st.kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if status.History() != History || status.Bucket() != DefaultBucket {
		t.Errorf("bucket %s keeps %d revisions, want %s keeping %d", status.Bucket(), status.History(), DefaultBucket, History)
	}
	if _, err := st.Current(ctx); !errors.Is(err, ErrNoPolicy) {
		t.Errorf("Current of an empty bucket: got %v, want ErrNoPolicy", err)
	}
	if _, err := Open(ctx, Config{Conn: nc, NoCreate: true, Logger: quiet}); err != nil {
		t.Errorf("NoCreate on the bucket now there: %v", err)
	}
	if h := history(t, st); len(h) != 0 {
		t.Errorf("history of an empty bucket: got %d revisions", len(h))
	}
}

func TestPushHistoryGet(t *testing.T) {
	ctx := testCtx(t)
	st := open(t, ctx, nil)
	r1 := mustPush(t, st, doc(10), alice)
	r2 := mustPush(t, st, doc(20), Meta{Author: "bob", ClaimedAuthor: "robert", Message: "raise"})
	if r1.Revision == 0 || r2.Revision <= r1.Revision {
		t.Fatalf("revisions %d then %d, want increasing from 1", r1.Revision, r2.Revision)
	}
	set, _ := policy.Parse("x", doc(20))
	if r2.Version != set.Version() {
		t.Errorf("version %q, want %q", r2.Version, set.Version())
	}
	wantDiff := "@@ -1,5 +1,5 @@\n rules:\n   - name: per-tenant\n     key: [tenant]\n-    limit: 10\n+    limit: 20\n     period: 1s\n"
	if r2.Diff != wantDiff {
		t.Errorf("diff:\n%s\nwant:\n%s", r2.Diff, wantDiff)
	}
	if !strings.HasPrefix(r1.Diff, "@@ -0,0 +1,5 @@\n+rules:\n") {
		t.Errorf("first push's diff: got %q, want the whole document added", r1.Diff)
	}
	cur, err := st.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	opts := cmpopts.EquateApproxTime(0)
	if d := cmp.Diff(r2, cur, opts); d != "" {
		t.Errorf("Current is not what Push returned (-push +current):\n%s", d)
	}
	got, err := st.Get(ctx, r1.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(r1, got, opts); d != "" {
		t.Errorf("Get(%d) (-push +get):\n%s", r1.Revision, d)
	}
	if got.Name() != "nats-kv://ration-policy revision 1" {
		t.Errorf("name %q", got.Name())
	}
	for _, rev := range []uint64{0, r2.Revision + 1} {
		if _, err := st.Get(ctx, rev); !errors.Is(err, ErrNoRevision) {
			t.Errorf("Get(%d): got %v, want ErrNoRevision", rev, err)
		}
	}
	want := []brief{
		{Key: KeyEnforced, Op: OpPush, Author: "alice", Message: "first", Source: string(doc(10))},
		{Key: KeyEnforced, Op: OpPush, Author: "bob", Claimed: "robert", Message: "raise", Source: string(doc(20))},
	}
	if d := cmp.Diff(want, briefs(history(t, st))); d != "" {
		t.Errorf("history (-want +got):\n%s", d)
	}
}

func TestPushUnchanged(t *testing.T) {
	ctx := testCtx(t)
	st := open(t, ctx, nil)
	r1 := mustPush(t, st, doc(10), alice)
	// Comments and layout do not change the Version.
	same := append([]byte("# a comment\n"), doc(10)...)
	got, err := st.Push(ctx, same, alice)
	if !errors.Is(err, ErrUnchanged) || got.Revision != r1.Revision {
		t.Fatalf("pushing the same policy: got revision %d, %v; want %d, ErrUnchanged", got.Revision, err, r1.Revision)
	}
	if _, err := st.Push(ctx, same, Meta{Shadow: true}); !errors.Is(err, ErrUnchanged) {
		t.Errorf("staging the enforced policy: got %v, want ErrUnchanged", err)
	}
	s1 := mustPush(t, st, doc(20), Meta{Shadow: true})
	if got, err := st.Push(ctx, doc(20), Meta{Shadow: true}); !errors.Is(err, ErrUnchanged) || got.Revision != s1.Revision {
		t.Errorf("staging the staged policy again: got %d, %v; want %d, ErrUnchanged", got.Revision, err, s1.Revision)
	}
	if h := history(t, st); len(h) != 2 {
		t.Errorf("history holds %d revisions, want 2", len(h))
	}
}

func TestPushInvalidWritesNothing(t *testing.T) {
	ctx := testCtx(t)
	st := open(t, ctx, nil)
	bad := []byte("rules:\n  - name: per-tenant\n    key: [tenant]\n    limit: -1\n")
	_, err := st.Push(ctx, bad, alice)
	var es policy.Errors
	if !errors.Is(err, policy.ErrInvalid) || !errors.As(err, &es) || es[0].Field != "rules[0].limit" {
		t.Fatalf("got %v, want policy.Errors on rules[0].limit", err)
	}
	if _, err := st.Push(ctx, bad, Meta{Shadow: true}); !errors.Is(err, policy.ErrInvalid) {
		t.Errorf("staging: got %v, want policy.ErrInvalid", err)
	}
	if h := history(t, st); len(h) != 0 {
		t.Errorf("a refused document wrote %d revisions", len(h))
	}
}

func TestPushTooLarge(t *testing.T) {
	ctx := testCtx(t)
	st := open(t, ctx, nil)
	huge := append(doc(1), bytes.Repeat([]byte("# padding padding padding padding\n"), MaxDocument/30)...)
	if _, err := st.Push(ctx, huge, alice); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "1 MiB") {
		t.Fatalf("got %v, want ErrTooLarge naming the limit", err)
	}
	if h := history(t, st); len(h) != 0 {
		t.Errorf("a refused document wrote %d revisions", len(h))
	}
}

// TestPushMaxPayload shows the server's max_payload bounding the value:
// a diff that would not fit is left out, and a document that would not
// fit even so is refused.
func TestPushMaxPayload(t *testing.T) {
	ctx := testCtx(t)
	s := startServer(t, embedded.Config{MaxPayload: 64 << 10})
	st := open(t, ctx, connect(t, s.ClientURL()))
	pad := func(limit int, c string, n int) []byte {
		return append(doc(limit), bytes.Repeat([]byte("# "+c+"\n"), n)...)
	}
	mustPush(t, st, pad(1, "a", 10_000), alice) // 40 kB
	r := mustPush(t, st, pad(2, "b", 10_000), alice)
	if r.Diff != "" {
		t.Errorf("a diff of %d bytes was kept, want it left out", len(Diff(pad(1, "a", 10_000), pad(2, "b", 10_000))))
	}
	if cur, err := st.Current(ctx); err != nil || !bytes.Equal(cur.Source, pad(2, "b", 10_000)) {
		t.Errorf("Current: got %v; want the second document", err)
	}
	if _, err := st.Push(ctx, pad(3, "c", 20_000), alice); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "max_payload") {
		t.Errorf("got %v, want ErrTooLarge naming max_payload", err)
	}
	if h := history(t, st); len(h) != 2 {
		t.Errorf("history holds %d revisions, want 2", len(h))
	}
}

// TestPushConflict writes the key from a second store between the first
// store's read and its write: the first one's write fails with
// ErrConflict and the second one's stands.
func TestPushConflict(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first bool // the key does not exist yet: Create instead of Update
		meta  Meta
	}{
		{"update", false, alice},
		{"create", true, alice},
		{"stage", false, Meta{Shadow: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			nc := connect(t, startServer(t, embedded.Config{}).ClientURL())
			a, b := open(t, ctx, nc), open(t, ctx, nc)
			if !tc.first {
				mustPush(t, a, doc(1), alice)
				if tc.meta.Shadow {
					mustPush(t, a, doc(2), tc.meta)
				}
			}
			var theirs Revision
			a.beforeWrite = func() {
				a.beforeWrite = nil
				theirs = mustPush(t, b, doc(3), tc.meta)
			}
			if _, err := a.Push(ctx, doc(4), tc.meta); !errors.Is(err, ErrConflict) {
				t.Fatalf("got %v, want ErrConflict", err)
			}
			get := a.Current
			if tc.meta.Shadow {
				get = a.Staged
			}
			if got, err := get(ctx); err != nil || got.Revision != theirs.Revision {
				t.Errorf("after the conflict: got revision %d, %v; want the other writer's %d", got.Revision, err, theirs.Revision)
			}
		})
	}
}

func TestRollback(t *testing.T) {
	ctx := testCtx(t)
	st := open(t, ctx, nil)
	r1 := mustPush(t, st, doc(10), alice)
	mustPush(t, st, doc(20), alice)
	rb, err := st.Rollback(ctx, r1.Revision, Meta{Author: "carol", Message: "back"})
	if err != nil {
		t.Fatal(err)
	}
	want := brief{Key: KeyEnforced, Op: OpRollback, Author: "carol", Message: "back", From: r1.Revision, Source: string(doc(10))}
	if d := cmp.Diff(want, briefOf(rb)); d != "" {
		t.Errorf("rollback (-want +got):\n%s", d)
	}
	if rb.Version != r1.Version || !strings.Contains(rb.Diff, "-    limit: 20\n+    limit: 10\n") {
		t.Errorf("rollback: version %s (want %s), diff %q", rb.Version, r1.Version, rb.Diff)
	}
	if cur, _ := st.Current(ctx); cur.Revision != rb.Revision {
		t.Errorf("Current is %d, want the rollback's %d", cur.Revision, rb.Revision)
	}
	if _, err := st.Rollback(ctx, r1.Revision, alice); !errors.Is(err, ErrUnchanged) {
		t.Errorf("rolling back to the enforced policy: got %v, want ErrUnchanged", err)
	}
	if _, err := st.Rollback(ctx, 99, alice); !errors.Is(err, ErrNoRevision) {
		t.Errorf("rolling back to a missing revision: got %v, want ErrNoRevision", err)
	}
	// A bad document put with the nats CLI cannot be rolled back to.
	bad, err := st.kv.Put(ctx, KeyEnforced, []byte("rules: [nope]\n"))
	if err != nil {
		t.Fatal(err)
	}
	mustPush(t, st, doc(30), alice)
	_, err = st.Rollback(ctx, bad, alice)
	if !errors.Is(err, policy.ErrInvalid) || !strings.Contains(err.Error(), "nats-kv://ration-policy revision") {
		t.Errorf("rolling back to an invalid revision: got %v, want policy.ErrInvalid naming the revision", err)
	}
}

func TestStagePromoteUnstage(t *testing.T) {
	ctx := testCtx(t)
	st := open(t, ctx, nil)
	r1 := mustPush(t, st, doc(10), alice)
	if _, err := st.Staged(ctx); !errors.Is(err, ErrNoStaged) {
		t.Fatalf("Staged: got %v, want ErrNoStaged", err)
	}
	s1 := mustPush(t, st, doc(20), Meta{Author: "bob", Message: "try 20", Shadow: true})
	if s1.Key != KeyStaged || s1.Op != OpStage || !strings.Contains(s1.Diff, "+    limit: 20") {
		t.Errorf("staged: %+v", briefOf(s1))
	}
	if cur, _ := st.Current(ctx); cur.Revision != r1.Revision {
		t.Errorf("staging changed the enforced revision to %d", cur.Revision)
	}
	if got, err := st.Staged(ctx); err != nil || got.Revision != s1.Revision {
		t.Errorf("Staged: got %d, %v; want %d", got.Revision, err, s1.Revision)
	}
	p, err := st.Promote(ctx, Meta{Author: "carol"})
	if err != nil {
		t.Fatal(err)
	}
	want := brief{Key: KeyEnforced, Op: OpPromote, Author: "carol", Message: "try 20", From: s1.Revision, Source: string(doc(20))}
	if d := cmp.Diff(want, briefOf(p)); d != "" {
		t.Errorf("promote (-want +got):\n%s", d)
	}
	if _, err := st.Staged(ctx); !errors.Is(err, ErrNoStaged) {
		t.Errorf("after promote, Staged: got %v, want ErrNoStaged", err)
	}
	if _, err := st.Promote(ctx, alice); !errors.Is(err, ErrNoStaged) {
		t.Errorf("promoting nothing: got %v, want ErrNoStaged", err)
	}
	if _, err := st.Unstage(ctx, alice); !errors.Is(err, ErrNoStaged) {
		t.Errorf("unstaging nothing: got %v, want ErrNoStaged", err)
	}

	s2 := mustPush(t, st, doc(30), Meta{Author: "bob", Shadow: true})
	u, err := st.Unstage(ctx, Meta{Author: "dave", Message: "no"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Staged(ctx); !errors.Is(err, ErrNoStaged) {
		t.Errorf("after unstage, Staged: got %v, want ErrNoStaged", err)
	}
	if cur, _ := st.Current(ctx); cur.Revision != p.Revision {
		t.Errorf("unstage changed the enforced revision to %d", cur.Revision)
	}
	wantHist := []brief{
		{Key: KeyEnforced, Op: OpPush, Author: "alice", Message: "first", Source: string(doc(10))},
		{Key: KeyStaged, Op: OpStage, Author: "bob", Message: "try 20", Source: string(doc(20))},
		{Key: KeyEnforced, Op: OpPromote, Author: "carol", Message: "try 20", From: s1.Revision, Source: string(doc(20))},
		{Key: KeyStaged, Op: OpPromote, Author: "carol", Message: "try 20", From: s1.Revision, Deleted: true},
		{Key: KeyStaged, Op: OpStage, Author: "bob", Source: string(doc(30))},
		{Key: KeyStaged, Op: OpUnstage, Author: "dave", Message: "no", From: s2.Revision, Deleted: true},
	}
	h := history(t, st)
	if d := cmp.Diff(wantHist, briefs(h)); d != "" {
		t.Errorf("history (-want +got):\n%s", d)
	}
	if h[len(h)-1].Revision != u.Revision {
		t.Errorf("unstage returned revision %d, history ends at %d", u.Revision, h[len(h)-1].Revision)
	}
	if _, err := st.Get(ctx, u.Revision); !errors.Is(err, ErrNoRevision) {
		t.Errorf("Get of a delete marker: got %v, want ErrNoRevision", err)
	}

	// A staged policy that means the same as the enforced one is not
	// promoted.
	mustPush(t, st, doc(40), Meta{Shadow: true})
	mustPush(t, st, doc(40), alice)
	if _, err := st.Promote(ctx, alice); !errors.Is(err, ErrUnchanged) {
		t.Errorf("promoting the enforced policy: got %v, want ErrUnchanged", err)
	}
}

// TestRawValues reads values the nats CLI wrote: YAML without an envelope,
// valid or not, and delete markers without a body.
func TestRawValues(t *testing.T) {
	ctx := testCtx(t)
	st := open(t, ctx, nil)
	raw := []byte("rules:\n  - {name: a, key: [tenant], limit: 5}\n")
	if _, err := st.kv.Put(ctx, KeyEnforced, raw); err != nil {
		t.Fatal(err)
	}
	cur, err := st.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := brief{Key: KeyEnforced, Op: OpPut, Raw: true, Source: string(raw)}
	if d := cmp.Diff(want, briefOf(cur)); d != "" {
		t.Errorf("raw value (-want +got):\n%s", d)
	}
	if cur.Time.IsZero() || time.Since(cur.Time) > time.Hour {
		t.Errorf("raw value's time %v, want the server's time of the write", cur.Time)
	}
	if set, err := cur.Set(); err != nil || len(set.Rules()) != 1 {
		t.Errorf("raw value's Set: %v", err)
	}
	// JSON is YAML: a JSON policy without a format field is raw too.
	jsonDoc := []byte(`{"rules": [{"name": "a", "key": ["tenant"], "limit": 6}]}`)
	if _, err := st.kv.Put(ctx, KeyEnforced, jsonDoc); err != nil {
		t.Fatal(err)
	}
	if cur, err := st.Current(ctx); err != nil || !cur.Raw {
		t.Errorf("a JSON policy: got %+v, %v; want it raw", briefOf(cur), err)
	}
	// A push over a raw value diffs against it.
	r := mustPush(t, st, doc(7), alice)
	if !strings.Contains(r.Diff, `-{"rules"`) {
		t.Errorf("diff against a raw value: %q", r.Diff)
	}
	if err := st.kv.Delete(ctx, KeyEnforced); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Current(ctx); !errors.Is(err, ErrNoPolicy) {
		t.Errorf("after nats kv del: got %v, want ErrNoPolicy", err)
	}
	h := history(t, st)
	if last := h[len(h)-1]; !last.Deleted || last.Op != OpDelete || !last.Raw {
		t.Errorf("a bare delete marker: %+v", briefOf(last))
	}
}

// TestUnreadableValue shows an envelope of an unknown format: Current
// reports ErrFormat, History lists it, and a push replaces it.
func TestUnreadableValue(t *testing.T) {
	ctx := testCtx(t)
	st := open(t, ctx, nil)
	if _, err := st.kv.Put(ctx, KeyEnforced, []byte(`{"format":"ration-policy/v9","policy":"rules: []"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Current(ctx); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "v9") {
		t.Errorf("Current: got %v, want ErrFormat naming the format", err)
	}
	h := history(t, st)
	if len(h) != 1 || h[0].Op != OpUnreadable || !strings.Contains(h[0].Message, "v9") {
		t.Errorf("history: %+v", briefs(h))
	}
	if _, err := st.Push(ctx, doc(1), alice); err != nil {
		t.Errorf("a push over an unreadable value: %v", err)
	}
}

// TestCustomBucket uses a bucket of another name with a replica count
// the single server can hold.
func TestCustomBucket(t *testing.T) {
	ctx := testCtx(t)
	nc := connect(t, startServer(t, embedded.Config{}).ClientURL())
	st, err := Open(ctx, Config{Conn: nc, Bucket: "other", Replicas: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r := mustPush(t, st, doc(1), alice)
	if r.Bucket != "other" || r.Name() != "nats-kv://other revision 1" {
		t.Errorf("revision of bucket %q named %q", r.Bucket, r.Name())
	}
	js, _ := jetstream.New(nc)
	if _, err := js.KeyValue(ctx, DefaultBucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("the default bucket: got %v, want it not created", err)
	}
}
