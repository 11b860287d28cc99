package kvstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/sync/embedded"
)

// logs collects a logger's records as JSON, safely for concurrent use.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// records returns the records whose message starts with msg.
func (l *logs) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(l.buf.Bytes(), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if s, _ := rec["msg"].(string); strings.HasPrefix(s, msg) {
			out = append(out, rec)
		}
	}
	return out
}

// events records a Watcher's callbacks.
type events struct {
	applied chan Revision
	refused chan refusal
}

type refusal struct {
	rev Revision
	err error
}

func newEvents() *events {
	return &events{applied: make(chan Revision, 64), refused: make(chan refusal, 64)}
}

func (e *events) config(log *slog.Logger) WatcherConfig {
	return WatcherConfig{
		Logger:    log,
		OnApplied: func(r Revision) { e.applied <- r },
		OnRefused: func(r Revision, err error) { e.refused <- refusal{r, err} },
		RetryWait: 20 * time.Millisecond,
	}
}

// nextRefusal waits for the next refusal.
func (e *events) nextRefusal(t *testing.T, ctx context.Context) refusal {
	t.Helper()
	select {
	case r := <-e.refused:
		return r
	case <-ctx.Done():
		t.Fatal("no refusal before the deadline")
		return refusal{}
	}
}

// run runs w.Run until the test ends, or stop is called, and checks that
// it returns nil.
func run(t *testing.T, w *Watcher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitRevision waits until the enforced revision is rev.
func waitRevision(t *testing.T, w *Watcher, rev uint64) {
	t.Helper()
	_, ch, cancel := w.Subscribe()
	defer cancel()
	if !waitFor(t, ch, func() bool { return w.State().EnforcedRev.Revision == rev }) {
		t.Fatalf("the watcher holds revision %d, want %d", w.State().EnforcedRev.Revision, rev)
	}
}

func TestWatcherNoPolicy(t *testing.T) {
	ctx := testCtx(t)
	st := open(t, ctx, nil)
	if _, err := NewWatcher(ctx, st, WatcherConfig{Logger: quiet}); !errors.Is(err, ErrNoPolicy) {
		t.Errorf("got %v, want ErrNoPolicy", err)
	}
}

const badDoc = `rules:
  - name: fine
    key: [tenant]
    limit: 10
  - name: bad-one
    key: [tenant]
    limit: -1
    period: 0s
`

// TestWatcherAppliesAndRefuses follows pushes, a bad revision put with
// the nats CLI, a staged revision and its removal, and a deleted enforced
// key.
func TestWatcherAppliesAndRefuses(t *testing.T) {
	ctx := testCtx(t)
	st := open(t, ctx, nil)
	r1 := mustPush(t, st, doc(1), alice)
	var l logs
	ev := newEvents()
	w, err := NewWatcher(ctx, st, ev.config(l.logger()))
	if err != nil {
		t.Fatal(err)
	}
	if s := w.State(); s.EnforcedRev.Revision != r1.Revision || s.Enforced.Version() != r1.Version || s.Staged != nil {
		t.Fatalf("initial state: revision %d, staged %v", s.EnforcedRev.Revision, s.Staged)
	}
	if got := <-ev.applied; got.Revision != r1.Revision {
		t.Errorf("OnApplied(%d), want %d", got.Revision, r1.Revision)
	}
	run(t, w)

	r2 := mustPush(t, st, doc(2), Meta{Author: "bob"})
	waitRevision(t, w, r2.Revision)
	if got := <-ev.applied; got.Revision != r2.Revision { // called after the log
		t.Errorf("OnApplied(%d), want %d", got.Revision, r2.Revision)
	}
	if a := l.records(t, "policy applied"); len(a) != 2 || a[1]["revision"] != float64(r2.Revision) || a[1]["author"] != "bob" || a[1]["version"] != r2.Version {
		t.Errorf("applied logs: %v", a)
	}

	bad, err := st.kv.Put(ctx, KeyEnforced, []byte(badDoc))
	if err != nil {
		t.Fatal(err)
	}
	ref := ev.nextRefusal(t, ctx)
	var es policy.Errors
	if ref.rev.Revision != bad || !errors.As(ref.err, &es) || len(es) != 2 {
		t.Fatalf("refused revision %d with %v, want %d with two problems", ref.rev.Revision, ref.err, bad)
	}
	if s := w.State(); s.EnforcedRev.Revision != r2.Revision {
		t.Errorf("after a bad revision the watcher holds %d, want %d", s.EnforcedRev.Revision, r2.Revision)
	}
	recs := l.records(t, "policy revision refused")
	if len(recs) != 2 {
		t.Fatalf("%d refusal logs, want one per problem (2): %v", len(recs), recs)
	}
	for i, field := range []string{"rules[1].limit", "rules[1].period"} {
		r := recs[i]
		if r["revision"] != float64(bad) || r["field"] != field || r["rule"] != "bad-one" || r["problem"] == "" || r["running_revision"] != float64(r2.Revision) {
			t.Errorf("refusal log %d: %v", i, r)
		}
	}

	// A good revision after the bad one is applied.
	r3 := mustPush(t, st, doc(3), alice)
	waitRevision(t, w, r3.Revision)

	// Staged: applied beside the enforced one, refused when bad, removed.
	_, ch, cancel := w.Subscribe()
	defer cancel()
	s1 := mustPush(t, st, doc(4), Meta{Shadow: true})
	if !waitFor(t, ch, func() bool { return w.State().StagedRev.Revision == s1.Revision }) {
		t.Fatal("the staged revision was not applied")
	}
	if s := w.State(); s.Staged == nil || s.Staged.Version() != s1.Version || s.EnforcedRev.Revision != r3.Revision {
		t.Errorf("staged state: %+v", s)
	}
	badStaged, err := st.kv.Put(ctx, KeyStaged, []byte("rules: 5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if ref := ev.nextRefusal(t, ctx); ref.rev.Revision != badStaged || !errors.Is(ref.err, policy.ErrInvalid) {
		t.Errorf("refused %d with %v, want %d", ref.rev.Revision, ref.err, badStaged)
	}
	if s := w.State(); s.StagedRev.Revision != s1.Revision {
		t.Errorf("a bad staged revision replaced the staged state: %d", s.StagedRev.Revision)
	}
	if _, err := st.Unstage(ctx, alice); err != nil {
		t.Fatal(err)
	}
	if !waitFor(t, ch, func() bool { return w.State().Staged == nil }) {
		t.Fatal("the unstaged policy stays staged")
	}
	if s := w.State(); s.StagedRev.Revision != 0 {
		t.Errorf("StagedRev after unstage: %d", s.StagedRev.Revision)
	}

	// Deleting the enforced key is refused too.
	if err := st.kv.Delete(ctx, KeyEnforced); err != nil {
		t.Fatal(err)
	}
	if ref := ev.nextRefusal(t, ctx); !errors.Is(ref.err, ErrNoPolicy) {
		t.Errorf("deleting the enforced key: refused with %v, want ErrNoPolicy", ref.err)
	}
	if s := w.State(); s.EnforcedRev.Revision != r3.Revision {
		t.Errorf("after a delete the watcher holds %d, want %d", s.EnforcedRev.Revision, r3.Revision)
	}
}

// TestWatcherStartsOnTheLastValid starts while a bad revision is
// enforced: the newest valid one before it is used. With none, NewWatcher
// fails.
func TestWatcherStartsOnTheLastValid(t *testing.T) {
	ctx := testCtx(t)
	st := open(t, ctx, nil)
	if _, err := st.kv.Put(ctx, KeyEnforced, []byte(badDoc)); err != nil {
		t.Fatal(err)
	}
	_, err := NewWatcher(ctx, st, WatcherConfig{Logger: quiet})
	if !errors.Is(err, policy.ErrInvalid) || !errors.Is(err, ErrNoPolicy) {
		t.Fatalf("no valid revision: got %v, want policy.ErrInvalid and ErrNoPolicy", err)
	}
	good := mustPush(t, st, doc(1), alice)
	staged := mustPush(t, st, doc(2), Meta{Shadow: true})
	bad, err := st.kv.Put(ctx, KeyEnforced, []byte(badDoc))
	if err != nil {
		t.Fatal(err)
	}
	ev := newEvents()
	w, err := NewWatcher(ctx, st, ev.config(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if s := w.State(); s.EnforcedRev.Revision != good.Revision || s.StagedRev.Revision != staged.Revision {
		t.Errorf("started on %d (staged %d), want %d (staged %d)", s.EnforcedRev.Revision, s.StagedRev.Revision, good.Revision, staged.Revision)
	}
	if ref := ev.nextRefusal(t, ctx); ref.rev.Revision != bad {
		t.Errorf("refused %d, want %d", ref.rev.Revision, bad)
	}
	// Run does not refuse it a second time, and applies what follows.
	run(t, w)
	next := mustPush(t, st, doc(3), alice)
	waitRevision(t, w, next.Revision)
	select {
	case ref := <-ev.refused:
		t.Errorf("refused again: %d", ref.rev.Revision)
	default:
	}
}

// proxy forwards loopback TCP connections to a target until cut, so that a
// test can take one client's connection down and let it come back.
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		s, err := net.Dial("tcp", p.target)
		if p.cut || err != nil {
			p.mu.Unlock()
			c.Close()
			if s != nil {
				s.Close()
			}
			continue
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.wg.Add(2)
		go p.pipe(c, s)
		go p.pipe(s, c)
		p.mu.Unlock()
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// setCut closes every forwarded connection and refuses new ones (true),
// or forwards again (false).
func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
			delete(p.conns, c)
		}
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.setCut(true)
	p.wg.Wait()
}

// TestWatcherResumesAfterDisconnect takes the watcher's connection down,
// pushes a revision meanwhile, and shows it applied once the connection
// is back.
func TestWatcherResumesAfterDisconnect(t *testing.T) {
	ctx := testCtx(t)
	s := startServer(t, embedded.Config{})
	writer := open(t, ctx, connect(t, s.ClientURL()))
	mustPush(t, writer, doc(1), alice)

	p := newProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	wc := connect(t, p.url())
	reader, err := Open(ctx, Config{Conn: wc, NoCreate: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(ctx, reader, WatcherConfig{Logger: quiet, RetryWait: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	r2 := mustPush(t, writer, doc(2), alice)
	waitRevision(t, w, r2.Revision)

	p.setCut(true)
	if !waitFor(t, nil, func() bool { return !wc.IsConnected() }) {
		t.Fatal("the watcher's connection stayed up through the cut")
	}
	r3 := mustPush(t, writer, doc(3), Meta{Author: "while-down"})
	r4 := mustPush(t, writer, doc(4), Meta{Shadow: true})
	p.setCut(false)
	waitRevision(t, w, r3.Revision)
	_, ch, cancel := w.Subscribe()
	defer cancel()
	if !waitFor(t, ch, func() bool { return w.State().StagedRev.Revision == r4.Revision }) {
		t.Fatal("the revision staged while the connection was down was not applied")
	}
}

// TestWatcherSurvivesServerRestart stops the server and starts it again
// on the same port and JetStream directory: the watcher applies what is
// pushed to the new one.
func TestWatcherSurvivesServerRestart(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	s1, err := embedded.Start(embedded.Config{JetStream: true, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	url := s1.ClientURL()
	wc := connect(t, url)
	st := open(t, ctx, wc)
	mustPush(t, st, doc(1), alice)
	w, err := NewWatcher(ctx, st, WatcherConfig{Logger: quiet, RetryWait: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, w)
	// Once r2 is applied, the watch is up.
	r2 := mustPush(t, st, doc(2), alice)
	waitRevision(t, w, r2.Revision)
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := startServer(t, embedded.Config{Listen: strings.TrimPrefix(url, "nats://"), StoreDir: dir})
	writer := open(t, ctx, connect(t, s2.ClientURL()))
	r3 := mustPush(t, writer, doc(3), alice)
	waitRevision(t, w, r3.Revision)
	// Stopped while the server is up, the watch deletes its consumer at
	// once (with the server gone it would wait for the request's 5s).
	stop()
}

func TestRunEnds(t *testing.T) {
	ctx := testCtx(t)
	nc := connect(t, startServer(t, embedded.Config{}).ClientURL())
	st := open(t, ctx, nc)
	mustPush(t, st, doc(1), alice)
	w, err := NewWatcher(ctx, st, WatcherConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	// A second Run is refused while the first runs (it applied r2).
	r2 := mustPush(t, st, doc(2), alice)
	waitRevision(t, w, r2.Revision)
	if err := w.Run(ctx); err == nil {
		t.Error("a second Run ran")
	}
	nc.Close()
	if err := <-done; !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("Run after the connection closed: got %v, want nats.ErrConnectionClosed", err)
	}
}

// TestWatcherWithPermissions runs the store as regiond and the CLI do on
// a server with permissions: a region user with embedded.PolicyReader
// opens, watches and applies what a user with embedded.PolicyWriter
// creates and pushes, and cannot push itself.
func TestWatcherWithPermissions(t *testing.T) {
	ctx := testCtx(t)
	writer := embedded.User{Name: "cli", Password: "pw", Publish: []string{}, Subscribe: []string{}}.Allow(embedded.PolicyWriter(DefaultBucket))
	reader := embedded.RegionUser("ration.sync", "eu", "eu-pw").Allow(embedded.PolicyReader(DefaultBucket))
	s := startServer(t, embedded.Config{Users: []embedded.User{writer, reader}})
	rc := connect(t, s.ClientURL(), nats.UserInfo("eu", "eu-pw"),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // the refused push's violation

	if _, err := Open(ctx, Config{Conn: rc, NoCreate: true, Logger: quiet}); !errors.Is(err, ErrNoPolicy) {
		t.Fatalf("the reader opening a missing bucket: got %v, want ErrNoPolicy", err)
	}
	w1 := open(t, ctx, connect(t, s.ClientURL(), nats.UserInfo("cli", "pw")))
	mustPush(t, w1, doc(1), alice)

	st, err := Open(ctx, Config{Conn: rc, NoCreate: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(ctx, st, WatcherConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	r2 := mustPush(t, w1, doc(2), Meta{Shadow: true})
	r3 := mustPush(t, w1, doc(3), alice)
	waitRevision(t, w, r3.Revision)
	if got := w.State().StagedRev.Revision; got != r2.Revision {
		t.Errorf("staged revision %d, want %d", got, r2.Revision)
	}
	if h, err := st.History(ctx); err != nil || len(h) != 3 {
		t.Errorf("the reader's history: %d revisions, %v", len(h), err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := st.Push(short, doc(4), alice); err == nil {
		t.Error("the reader pushed")
	}
}
