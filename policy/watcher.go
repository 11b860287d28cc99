package policy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Path is the policy file to watch. Required.
	Path string
	// Interval is how often Run checks the file for changes. Default 1s.
	Interval time.Duration
	// Logger receives reload results and every problem of a bad file.
	// Default slog.Default().
	Logger *slog.Logger
	// OnRefused, if set, is called once for each content of the file that
	// failed to read or validate and was kept from replacing the current
	// set (as often as its problems are logged).
	OnRefused func(error)
}

// ErrInvalidConfig is wrapped by NewWatcher's and Validate's errors for a
// WatcherConfig that cannot be used.
var ErrInvalidConfig = errors.New("policy: invalid watcher config")

// withDefaults returns c with every zero optional field set to its default.
func (c WatcherConfig) withDefaults() WatcherConfig {
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports whether c, with its defaults filled, is usable by
// NewWatcher. The error wraps ErrInvalidConfig.
func (c WatcherConfig) Validate() error { return c.withDefaults().validate() }

func (c WatcherConfig) validate() error {
	switch {
	case c.Path == "":
		return fmt.Errorf("%w: Path is required", ErrInvalidConfig)
	case c.Interval < 0:
		return fmt.Errorf("%w: Interval must be >= 0 (got %s)", ErrInvalidConfig, c.Interval)
	}
	return nil
}

// racyWindow is how long after a file's modification time a read of it may
// miss a later write that keeps the same size and modification time (file
// systems with coarse timestamps). A file read within this window of its
// mtime is re-read and hashed on every poll until a read falls outside it.
const racyWindow = 2 * time.Second

// Watcher keeps the current Set of a policy file. It reloads the file when
// Run sees it change and when Reload is called (regiond calls it on SIGHUP).
// A file that fails to read or validate is logged, problem by problem, and
// never replaces the current Set. Methods are safe for concurrent use.
//
// A Watcher starts no goroutines: Run is the polling loop, run by its
// caller.
type Watcher struct {
	cfg WatcherConfig
	now func() time.Time // time.Now; tests replace it

	// reloadMu serialises loading and applying, and guards the poll state.
	// It is taken before mu.
	reloadMu sync.Mutex
	seen     fileState
	pollErr  string // the last error the poll logged, to log each once

	mu      sync.Mutex
	cur     *Set
	subs    map[*chan struct{}]struct{}
	updates chan *Set
}

// fileState identifies the content last read from the file, good or bad.
type fileState struct {
	modTime time.Time
	size    int64
	hash    [sha256.Size]byte
	readAt  time.Time
}

// NewWatcher loads cfg.Path once and returns a Watcher holding it. It fails
// if the first load fails: there is no good set to keep.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	w := &Watcher{cfg: cfg, now: time.Now, subs: make(map[*chan struct{}]struct{})}
	w.reloadMu.Lock()
	defer w.reloadMu.Unlock()
	set, _, err := w.load(true)
	if err != nil {
		return nil, err
	}
	w.cur = set
	cfg.Logger.Info("policy loaded", "path", cfg.Path, "version", set.Version(), "rules", len(set.rules))
	return w, nil
}

// Current returns the current set; never nil.
func (w *Watcher) Current() *Set {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur
}

// Subscribe returns the current set and a channel that receives a value
// after each later change of Current. The channel holds one pending value,
// so a slow subscriber never blocks the Watcher and changes that arrive
// while one is pending fold into it; on receiving, read Current for the
// latest set. cancel stops the notifications (the channel is not closed)
// and may be called more than once.
func (w *Watcher) Subscribe() (cur *Set, changed <-chan struct{}, cancel func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.subs[&ch] = struct{}{}
	return w.cur, ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.subs, &ch)
	}
}

// Updates returns a channel that receives the new set after each change of
// Current. It is for a single consumer (every call returns the same
// channel): a pending set that was not received yet is replaced by a newer
// one, so the consumer never blocks the Watcher and always ends up with
// the latest set. Subscribe suits several consumers.
func (w *Watcher) Updates() <-chan *Set {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.updates == nil {
		w.updates = make(chan *Set, 1)
	}
	return w.updates
}

// Reload re-reads the file now. On success a changed set becomes Current
// (a document whose Version equals the current one's changes nothing). On
// failure it logs the error, keeps the current set and returns the error:
// Errors (wrapping ErrInvalid) for a bad document, a wrapped I/O error
// otherwise.
func (w *Watcher) Reload() error {
	w.reloadMu.Lock()
	defer w.reloadMu.Unlock()
	set, _, err := w.load(true)
	if err != nil {
		w.logError(err)
		return err
	}
	w.pollErr = ""
	w.apply(set)
	return nil
}

// Run checks the file every Interval until ctx is done, then returns nil.
// A check that finds the file unchanged (same size, modification time and,
// while its timestamp is too recent to trust, content hash) reads nothing
// more. Problems are logged once each, not on every tick. Call Run at most
// once at a time.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.poll()
		}
	}
}

func (w *Watcher) poll() {
	w.reloadMu.Lock()
	defer w.reloadMu.Unlock()
	set, changed, err := w.load(false)
	if err != nil {
		if msg := err.Error(); changed || msg != w.pollErr {
			w.pollErr = msg
			w.logError(err)
		}
		return
	}
	w.pollErr = ""
	if set != nil {
		w.apply(set)
	}
}

// load reads and parses the file. Unless force is set, it returns a nil set
// and no error when the file is the one last read; changed reports whether
// new content was read. The caller holds reloadMu, and holds it through
// apply, so that an older read can never be applied after a newer one.
func (w *Watcher) load(force bool) (set *Set, changed bool, err error) {
	fi, err := os.Stat(w.cfg.Path)
	if err != nil {
		return nil, false, fmt.Errorf("policy: %w", err)
	}
	racy := !w.seen.modTime.Before(w.seen.readAt.Add(-racyWindow))
	if !force && !racy && fi.ModTime().Equal(w.seen.modTime) && fi.Size() == w.seen.size {
		return nil, false, nil
	}
	readAt := w.now()
	data, fi, err := readFile(w.cfg.Path)
	if err != nil {
		return nil, false, err
	}
	hash := sha256.Sum256(data)
	changed = hash != w.seen.hash
	w.seen = fileState{modTime: fi.ModTime(), size: fi.Size(), hash: hash, readAt: readAt}
	if !force && !changed {
		return nil, false, nil
	}
	set, err = Parse(w.cfg.Path, data)
	return set, changed, err
}

// apply makes set Current and notifies subscribers, unless it means the
// same as the current set. The caller holds reloadMu.
func (w *Watcher) apply(set *Set) {
	old := w.swap(set)
	if old == nil {
		return
	}
	w.cfg.Logger.Info("policy loaded", "path", w.cfg.Path, "version", set.Version(),
		"previous_version", old.Version(), "rules", len(set.rules))
}

// swap is apply's critical section; it returns the replaced set, or nil if
// set is not a change.
func (w *Watcher) swap(set *Set) (old *Set) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if set.Version() == w.cur.Version() {
		return nil
	}
	old = w.cur
	w.cur = set
	for ch := range w.subs {
		select {
		case *ch <- struct{}{}:
		default: // a notification is already pending
		}
	}
	if w.updates != nil {
		// Only apply sends, under mu, so after the drain the send has room.
		select {
		case <-w.updates:
		default:
		}
		w.updates <- set
	}
	return old
}

func (w *Watcher) logError(err error) {
	if w.cfg.OnRefused != nil {
		w.cfg.OnRefused(err)
	}
	keep := w.Current().Version()
	var es Errors
	if !errors.As(err, &es) {
		w.cfg.Logger.Error("policy reload failed; keeping the current policy",
			"path", w.cfg.Path, "version", keep, "error", err)
		return
	}
	for _, e := range es {
		w.cfg.Logger.Error("policy reload failed; keeping the current policy",
			"path", w.cfg.Path, "version", keep, "line", e.Line, "field", e.Field, "problem", e.Msg)
	}
}
