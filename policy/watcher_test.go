package policy

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

const (
	docA   = "rules: [{name: a, key: [t], limit: 1}]\n"
	docB   = "rules: [{name: b, key: [t], limit: 1}]\n" // same size as docA
	docC   = "rules: [{name: c, key: [t], limit: 1}]\n"
	docBad = "rules:\n  - {name: a, key: [t], limit: 0}\n  - {name: B, key: [t], limit: 1}\n"
)

// syncBuffer is a log sink the watcher and the test may use at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func writeFile(t testing.TB, path, doc string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
}

func newTestWatcher(t testing.TB, doc string) (*Watcher, string, *syncBuffer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, doc)
	logs := &syncBuffer{}
	w, err := NewWatcher(WatcherConfig{Path: path, Interval: time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatalf("NewWatcher: %v", err)
	}
	return w, path, logs
}

func ruleName(s *Set) string { return s.Rules()[0].Name }

// pending reports whether ch holds a notification, without waiting.
func pending(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestNewWatcherErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, docBad)
	for _, tc := range []struct {
		name string
		cfg  WatcherConfig
		is   error
	}{
		{"no path", WatcherConfig{}, ErrInvalidConfig},
		{"negative interval", WatcherConfig{Path: bad, Interval: -time.Second}, ErrInvalidConfig},
		{"missing file", WatcherConfig{Path: filepath.Join(dir, "missing.yaml")}, fs.ErrNotExist},
		{"bad file", WatcherConfig{Path: bad}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := NewWatcher(tc.cfg)
			if err == nil || w != nil {
				t.Fatalf("NewWatcher: got (%v, %v), want (nil, error)", w, err)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("NewWatcher: got %v, want an error wrapping %v", err, tc.is)
			}
		})
	}
}

func TestWatcherReload(t *testing.T) {
	w, path, logs := newTestWatcher(t, docA)
	cur, changed, cancel := w.Subscribe()
	defer cancel()
	updates := w.Updates()
	if got := ruleName(cur); got != "a" {
		t.Fatalf("Subscribe: got current rule %q, want %q", got, "a")
	}

	// Unchanged file: nothing to notify.
	if err := w.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if pending(changed) {
		t.Errorf("Reload of the same file: got a notification, want none")
	}

	// Same meaning, different text: not a change either.
	writeFile(t, path, "# comment\n"+docA)
	if err := w.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if pending(changed) {
		t.Errorf("Reload of a reformatted file: got a notification, want none")
	}

	writeFile(t, path, docB)
	if err := w.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if !pending(changed) {
		t.Errorf("Reload of a changed file: got no notification, want one")
	}
	if got := ruleName(w.Current()); got != "b" {
		t.Errorf("Current after Reload: got rule %q, want %q", got, "b")
	}
	select {
	case s := <-updates:
		if got := ruleName(s); got != "b" {
			t.Errorf("Updates: got rule %q, want %q", got, "b")
		}
	default:
		t.Errorf("Updates: got nothing, want the new set")
	}

	// A bad file keeps the good set, and every problem is logged.
	writeFile(t, path, docBad)
	err := w.Reload()
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("Reload of a bad file: got %v, want ErrInvalid", err)
	}
	if got := ruleName(w.Current()); got != "b" {
		t.Errorf("Current after a bad Reload: got rule %q, want %q (kept)", got, "b")
	}
	if pending(changed) {
		t.Errorf("bad Reload: got a notification, want none")
	}
	for _, want := range []string{
		`field=rules[0].limit problem="must be > 0"`,
		`field=rules[1].name problem="must match [a-z0-9][a-z0-9._-]* (got \"B\")"`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs: got\n%s\nwant a line containing %s", logs, want)
		}
	}

	// A missing file too.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Reload of a missing file: got %v, want fs.ErrNotExist", err)
	}
	if got := ruleName(w.Current()); got != "b" {
		t.Errorf("Current after a failed Reload: got rule %q, want %q (kept)", got, "b")
	}
}

func TestWatcherSlowSubscriber(t *testing.T) {
	w, path, _ := newTestWatcher(t, docA)
	_, changed, cancel := w.Subscribe()
	defer cancel()
	_, cancelled, cancel2 := w.Subscribe()
	cancel2()
	cancel2() // idempotent
	updates := w.Updates()

	// Two changes while nobody reads: neither blocks the watcher, and
	// the subscriber is left with one notification and the latest set.
	for _, doc := range []string{docB, docC} {
		writeFile(t, path, doc)
		if err := w.Reload(); err != nil {
			t.Fatalf("Reload: %v", err)
		}
	}
	if !pending(changed) {
		t.Fatalf("after two changes: got no notification, want one")
	}
	if pending(changed) {
		t.Errorf("after two changes: got a second notification, want them folded into one")
	}
	if got := ruleName(w.Current()); got != "c" {
		t.Errorf("Current: got rule %q, want %q", got, "c")
	}
	if got := ruleName(<-updates); got != "c" {
		t.Errorf("Updates: got rule %q, want the latest, %q", got, "c")
	}
	if pending(cancelled) {
		t.Errorf("cancelled subscription: got a notification, want none")
	}
}

// TestWatcherRun drives the polling loop on synctest's fake clock: each
// time.Sleep below advances it past one Interval instantly.
func TestWatcherRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, path, logs := newTestWatcher(t, docA)
		_, changed, cancel := w.Subscribe()
		defer cancel()
		ctx, stop := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- w.Run(ctx) }()

		tick := func() {
			time.Sleep(w.cfg.Interval)
			synctest.Wait()
		}
		writeFile(t, path, docB)
		tick()
		if !pending(changed) || ruleName(w.Current()) != "b" {
			t.Fatalf("after a change and a tick: got rule %q, want %q and a notification", ruleName(w.Current()), "b")
		}

		// A bad file is logged once however many ticks see it.
		writeFile(t, path, docBad)
		tick()
		tick()
		tick()
		if got := strings.Count(logs.String(), "rules[0].limit"); got != 1 {
			t.Errorf("bad file over three ticks: got %d log lines for its problem, want 1\n%s", got, logs)
		}
		if pending(changed) || ruleName(w.Current()) != "b" {
			t.Errorf("bad file: got rule %q, want %q kept and no notification", ruleName(w.Current()), "b")
		}

		writeFile(t, path, docC)
		tick()
		if !pending(changed) || ruleName(w.Current()) != "c" {
			t.Errorf("after a fix and a tick: got rule %q, want %q and a notification", ruleName(w.Current()), "c")
		}

		stop()
		if err := <-done; err != nil {
			t.Errorf("Run after cancel: got %v, want nil", err)
		}
	})
}

// TestWatcherSameSizeSameMtime checks that a rewrite keeping the size and
// the modification time is still seen while the timestamp is too recent to
// trust, and that an old, unchanged file is not read again.
func TestWatcherSameSizeSameMtime(t *testing.T) {
	w, path, _ := newTestWatcher(t, docA)
	mtime := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := mtime.Add(time.Second) // within racyWindow of mtime
	w.now = func() time.Time { return now }
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	w.poll() // reads the file with the new mtime

	writeFile(t, path, docB)
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	w.poll()
	if got := ruleName(w.Current()); got != "b" {
		t.Fatalf("racy rewrite: got rule %q, want %q", got, "b")
	}

	// Read again well after mtime: the stat is now trusted, so a rewrite
	// that keeps size and mtime (which a real file system would not do this
	// late) is not read.
	now = mtime.Add(time.Hour)
	writeFile(t, path, docB)
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	w.poll()
	writeFile(t, path, docC)
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	w.poll()
	if got := ruleName(w.Current()); got != "b" {
		t.Errorf("trusted stat: got rule %q, want %q (not re-read)", got, "b")
	}
	// Reload always reads.
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := ruleName(w.Current()); got != "c" {
		t.Errorf("Reload: got rule %q, want %q", got, "c")
	}
}
