package embedded

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const bucket = "ration-policy"

func startJS(t *testing.T, cfg Config) *Server {
	t.Helper()
	cfg.JetStream = true
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func kvOf(t *testing.T, ctx context.Context, nc *nats.Conn, create bool) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var kv jetstream.KeyValue
	if create {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 8})
	} else {
		kv, err = js.KeyValue(ctx, bucket)
	}
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func getString(t *testing.T, ctx context.Context, kv jetstream.KeyValue, key string) string {
	t.Helper()
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return string(e.Value())
}

// TestJetStreamKV creates a bucket on a server with JetStream, writes and
// reads it, and shows the temporary directory gone after Close.
func TestJetStreamKV(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := startJS(t, Config{})
	dir := s.StoreDir()
	if dir == "" {
		t.Fatal("StoreDir is empty with JetStream on")
	}
	nc := connect(t, s.ClientURL())
	kv := kvOf(t, ctx, nc, true)
	rev, err := kv.Put(ctx, "enforced", []byte("rules: []"))
	if err != nil {
		t.Fatal(err)
	}
	if got := getString(t, ctx, kv, "enforced"); got != "rules: []" {
		t.Errorf("got %q, want %q", got, "rules: []")
	}
	e, err := kv.GetRevision(ctx, "enforced", rev)
	if err != nil || e.Revision() != rev {
		t.Errorf("GetRevision(%d): got %v, %v", rev, e, err)
	}
	nc.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Close, stat %s: got %v, want it removed", dir, err)
	}
}

func TestWithoutJetStream(t *testing.T) {
	s, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if d := s.StoreDir(); d != "" {
		t.Errorf("StoreDir without JetStream: got %q, want empty", d)
	}
}

// TestJetStreamStoreDirKept starts a server on a given directory twice, on
// the same port: the second finds the bucket the first wrote, and Close
// leaves the directory.
func TestJetStreamStoreDirKept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	s1, err := Start(Config{JetStream: true, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	url := s1.ClientURL()
	nc := connect(t, url)
	if _, err := kvOf(t, ctx, nc, true).Put(ctx, "enforced", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("a given StoreDir was removed: %v", err)
	}
	host := strings.TrimPrefix(url, "nats://")
	s2 := startJS(t, Config{Listen: host, StoreDir: dir})
	nc = connect(t, s2.ClientURL())
	if got := getString(t, ctx, kvOf(t, ctx, nc, false), "enforced"); got != "v1" {
		t.Errorf("after a restart on the same directory: got %q, want v1", got)
	}
}

func TestAllow(t *testing.T) {
	u := RegionUser("ration.sync", "eu", "pw").Allow(Permissions{Publish: []string{"a", "ration.sync.eu"}, Subscribe: []string{"_INBOX.>"}})
	want := User{Name: "eu", Password: "pw", Publish: []string{"ration.sync.eu", "a"}, Subscribe: []string{"ration.sync.>", "_INBOX.>"}}
	if d := cmp.Diff(want, u); d != "" {
		t.Errorf("Allow (-want +got):\n%s", d)
	}
	all := User{Name: "all", Password: "pw"}.Allow(PolicyReader(bucket))
	if all.Publish != nil || all.Subscribe != nil {
		t.Errorf("Allow on a user allowed every subject: got %v %v, want nil lists", all.Publish, all.Subscribe)
	}
}

// TestPolicyPermissions shows a region user with PolicyReader reading,
// fetching revisions of and watching the bucket a PolicyWriter user
// created and writes, while its own writes to the bucket and its publishes
// outside its report subject are refused.
func TestPolicyPermissions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	writer := User{Name: "cli", Password: "cli-pw", Publish: []string{}, Subscribe: []string{}}.Allow(PolicyWriter(bucket))
	reader := RegionUser("ration.sync", "eu", "eu-pw").Allow(PolicyReader(bucket))
	s := startJS(t, Config{Users: []User{writer, reader}})

	wc := connect(t, s.ClientURL(), nats.UserInfo("cli", "cli-pw"))
	wkv := kvOf(t, ctx, wc, true)
	rev1, err := wkv.Put(ctx, "enforced", []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := wc.RequestWithContext(ctx, "$SYS.REQ.USER.INFO", nil)
	if err != nil || !strings.Contains(string(resp.Data), `"user":"cli"`) {
		t.Errorf("writer's user info: got %v, %v, want its user", resp, err)
	}

	asyncErr := make(chan error, 16)
	rc := connect(t, s.ClientURL(), nats.UserInfo("eu", "eu-pw"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case asyncErr <- err:
		default:
		}
	}))
	rkv := kvOf(t, ctx, rc, false)
	if got := getString(t, ctx, rkv, "enforced"); got != "one" {
		t.Errorf("reader's get: got %q, want one", got)
	}
	w, err := rkv.WatchFiltered(ctx, []string{"enforced", "staged"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	next := func() jetstream.KeyValueEntry {
		t.Helper()
		select {
		case e := <-w.Updates():
			return e
		case <-ctx.Done():
			t.Fatal("watch: no update before the deadline")
			return nil
		}
	}
	if e := next(); e == nil || string(e.Value()) != "one" {
		t.Fatalf("watch's first entry: got %v, want enforced=one", e)
	}
	if e := next(); e != nil {
		t.Fatalf("watch: got %v, want the end of the initial values (nil)", e)
	}
	if _, err := wkv.Put(ctx, "staged", []byte("two")); err != nil {
		t.Fatal(err)
	}
	if e := next(); e == nil || e.Key() != "staged" || string(e.Value()) != "two" {
		t.Fatalf("watch: got %v, want staged=two", e)
	}
	if e, err := rkv.GetRevision(ctx, "enforced", rev1); err != nil || string(e.Value()) != "one" {
		t.Errorf("reader's GetRevision(%d): got %v, %v", rev1, e, err)
	}
	if h, err := rkv.History(ctx, "enforced"); err != nil || len(h) != 1 {
		t.Errorf("reader's History: got %d entries, %v; want 1", len(h), err)
	}

	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	if _, err := rkv.Put(short, "enforced", []byte("forged")); err == nil {
		t.Error("the reader's put succeeded, want it refused")
	}
	if got := getString(t, ctx, wkv, "enforced"); got != "one" {
		t.Errorf("after the reader's refused put: got %q, want one", got)
	}
	js, err := jetstream.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(short, jetstream.KeyValueConfig{Bucket: "other"}); err == nil {
		t.Error("the reader created a bucket, want it refused")
	}

	// The region's confinement to its own report subject stays.
	sub, err := rc.SubscribeSync("ration.sync.>")
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"ration.sync.us", "ration.sync.eu"} {
		if err := rc.Publish(subj, []byte(subj)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil || m.Subject != "ration.sync.eu" {
		t.Errorf("the reader's own report: got %v, %v; want only ration.sync.eu", m, err)
	}
	for {
		select {
		case err := <-asyncErr:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), "ration.sync.us") {
				return
			}
		case <-ctx.Done():
			t.Fatal("the server did not refuse the reader's publish on ration.sync.us")
		}
	}
}
