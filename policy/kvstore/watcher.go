package kvstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ration-dev/ration/policy"
)

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Logger receives every applied and refused revision. Default: the
	// Store's.
	Logger *slog.Logger
	// OnApplied, if set, is called with each revision the Watcher applies
	// (the one NewWatcher loads included), and with the delete marker that
	// removes the staged policy. It runs on the goroutine of NewWatcher or
	// Run and must not block for long.
	OnApplied func(Revision)
	// OnRefused, if set, is called with each revision the Watcher refuses
	// and why, as OnApplied.
	OnRefused func(rev Revision, err error)
	// RetryWait is how long Run waits before watching again after a watch
	// failed for a reason other than a reconnect (which resumes at once).
	// Default 1s.
	RetryWait time.Duration
}

func (c WatcherConfig) withDefaults(st *Store) WatcherConfig {
	if c.Logger == nil {
		c.Logger = st.cfg.Logger
	}
	if c.RetryWait == 0 {
		c.RetryWait = time.Second
	}
	return c
}

// State is what a Watcher holds.
type State struct {
	// Enforced is the policy to enforce, parsed from EnforcedRev; never nil
	// in a State of a Watcher.
	Enforced    *policy.Set
	EnforcedRev Revision
	// Staged is the staged policy, nil when none is; StagedRev is its
	// revision, the zero Revision when none is.
	Staged    *policy.Set
	StagedRev Revision
}

// setupTimeout bounds the setting up of one watch.
const setupTimeout = 10 * time.Second

// errReconnected ends a watch when the connection came back: the watch
// starts again from the last revision handled.
var errReconnected = errors.New("kvstore: reconnected")

// Watcher follows the bucket's two keys and holds the latest valid
// revision of each. A revision that does not decode or validate (or that
// deletes the enforced key) is refused: the State stays as it was,
// OnRefused is called, and every problem is logged once with the
// revision, the field, the rule's name and the message.
//
// A Watcher starts no goroutines: Run is its loop, run by its caller. Its
// other methods are safe for concurrent use.
type Watcher struct {
	store *Store
	cfg   WatcherConfig

	// runMu is held by Run; it guards next and seen, which NewWatcher
	// sets before any Run.
	runMu sync.Mutex
	next  uint64            // the revision to watch from
	seen  map[string]uint64 // the last revision handled, per key

	mu    sync.Mutex
	state State
	subs  map[*chan struct{}]struct{}
}

// NewWatcher loads the enforced and staged revisions. When the enforced
// one does not validate it is refused and the newest kept enforced
// revision that does is used instead, so that a region that starts while
// a bad revision is enforced runs what the others kept. It fails with
// ErrNoPolicy when nothing is enforced, with the refusal's error when no
// kept enforced revision validates, or when the bucket cannot be read.
func NewWatcher(ctx context.Context, st *Store, cfg WatcherConfig) (*Watcher, error) {
	cfg = cfg.withDefaults(st)
	w := &Watcher{store: st, cfg: cfg, seen: make(map[string]uint64), subs: make(map[*chan struct{}]struct{})}
	// Revisions after the stream's last sequence now are watched by Run;
	// the reads below are at least as new, and seen skips them again.
	stream, err := st.js.Stream(ctx, "KV_"+st.cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("kvstore: bucket %s: %w", st.cfg.Bucket, err)
	}
	w.next = stream.CachedInfo().State.LastSeq + 1

	cur, err := st.Current(ctx)
	if err != nil && !errors.Is(err, ErrFormat) {
		return nil, err
	}
	w.seen[KeyEnforced] = cur.Revision
	var set *policy.Set
	perr := err
	if perr == nil {
		set, perr = cur.Set()
	}
	if perr != nil {
		w.refuse(cur, perr)
		if cur, set, err = w.fallback(ctx, cur.Revision); err != nil {
			return nil, fmt.Errorf("kvstore: no kept enforced revision validates (%w); the latest: %w", err, perr)
		}
	}
	w.state.Enforced, w.state.EnforcedRev = set, cur
	w.applied(cur, set)

	staged, err := st.Staged(ctx)
	switch {
	case errors.Is(err, ErrNoStaged):
	case err != nil && !errors.Is(err, ErrFormat):
		return nil, err
	default:
		w.seen[KeyStaged] = staged.Revision
		w.stage(staged, err)
	}
	return w, nil
}

// fallback finds the newest enforced revision before rev that validates.
func (w *Watcher) fallback(ctx context.Context, rev uint64) (Revision, *policy.Set, error) {
	hist, err := w.store.History(ctx)
	if err != nil {
		return Revision{}, nil, err
	}
	for i := len(hist) - 1; i >= 0; i-- {
		r := hist[i]
		if r.Key != KeyEnforced || r.Deleted || r.Revision >= rev || r.Op == OpUnreadable {
			continue
		}
		if set, err := r.Set(); err == nil {
			w.cfg.Logger.Warn("policy: using an older enforced revision, the newest that validates",
				"bucket", r.Bucket, "revision", r.Revision, "refused_revision", rev)
			return r, set, nil
		}
	}
	return Revision{}, nil, ErrNoPolicy
}

// State returns what the Watcher holds now.
func (w *Watcher) State() State {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state
}

// Subscribe returns the State and a channel that receives a value after
// each later change of it (a revision applied, the staged one removed).
// The channel holds one pending value, so a slow subscriber never blocks
// the Watcher and changes that arrive while one is pending fold into it;
// on receiving, read State for the latest. cancel stops the
// notifications (the channel is not closed) and may be called more than
// once.
func (w *Watcher) Subscribe() (State, <-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.subs[&ch] = struct{}{}
	return w.state, ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.subs, &ch)
	}
}

// Run watches the bucket until ctx is done, then returns nil. It survives
// the connection's outages: when the connection comes back (or a watch
// fails, after RetryWait) it watches again from the last revision it
// handled, so that a revision written meanwhile is applied. It returns an
// error only when the connection is closed for good, or when called while
// another Run is running.
//
// Stopping a watch deletes its JetStream consumer, a request: when ctx ends
// while NATS is unreachable, Run returns after that request's timeout (the
// client's default, 5s). Closing the connection first makes it return at
// once.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.runMu.TryLock() {
		return errors.New("kvstore: Watcher.Run is already running")
	}
	defer w.runMu.Unlock()
	nc := w.store.cfg.Conn
	status := nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(status)
	for {
		err := w.watch(ctx, status)
		switch {
		case ctx.Err() != nil:
			return nil
		case nc.IsClosed():
			return fmt.Errorf("kvstore: watching bucket %s: %w", w.store.cfg.Bucket, nats.ErrConnectionClosed)
		case errors.Is(err, errReconnected):
			continue
		}
		w.cfg.Logger.Warn("policy watch interrupted; watching again", "bucket", w.store.cfg.Bucket, "from_revision", w.next, "err", err)
		t := time.NewTimer(w.cfg.RetryWait)
		select {
		case <-ctx.Done():
		case <-status:
		case <-t.C:
		}
		t.Stop()
	}
}

// watch runs one watch from w.next until ctx is done, the connection
// comes back or closes, or the watch fails.
func (w *Watcher) watch(ctx context.Context, status <-chan nats.Status) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	setup := time.AfterFunc(setupTimeout, cancel)
	kw, err := w.store.kv.WatchFiltered(wctx, []string{KeyEnforced, KeyStaged},
		jetstream.IncludeHistory(), jetstream.ResumeFromRevision(w.next))
	if !setup.Stop() {
		if err == nil {
			stopWatch(kw)
		}
		return fmt.Errorf("setting the watch up took more than %v", setupTimeout)
	}
	if err != nil {
		return err
	}
	defer stopWatch(kw)
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-status:
			if s == nats.CLOSED {
				return nats.ErrConnectionClosed
			}
			return errReconnected
		case e, ok := <-kw.Updates():
			if !ok {
				return errors.New("the watch ended")
			}
			if e != nil { // nil: the revisions kept at the start are delivered
				w.handle(e)
			}
		}
	}
}

// handle applies or refuses one watched entry, once.
func (w *Watcher) handle(e jetstream.KeyValueEntry) {
	w.next = max(w.next, e.Revision()+1)
	key := e.Key()
	if (key != KeyEnforced && key != KeyStaged) || e.Revision() <= w.seen[key] {
		return
	}
	w.seen[key] = e.Revision()
	r, err := w.store.revisionOf(e)
	if key == KeyStaged {
		w.stage(r, err)
		return
	}
	if err == nil && r.Deleted {
		err = fmt.Errorf("%w: revision %d removes the enforced policy", ErrNoPolicy, r.Revision)
	}
	var set *policy.Set
	if err == nil {
		set, err = r.Set()
	}
	if err != nil {
		w.refuse(r, err)
		return
	}
	w.update(func(s *State) { s.Enforced, s.EnforcedRev = set, r })
	w.applied(r, set)
}

// stage applies or refuses a revision of the staged key; err is its
// decoding's.
func (w *Watcher) stage(r Revision, err error) {
	if err == nil && r.Deleted {
		w.update(func(s *State) { s.Staged, s.StagedRev = nil, Revision{} })
		w.cfg.Logger.Info("staged policy removed", "bucket", r.Bucket, "revision", r.Revision, "op", r.Op,
			"staged_revision", r.FromRevision, "author", r.Author)
		if w.cfg.OnApplied != nil {
			w.cfg.OnApplied(r)
		}
		return
	}
	var set *policy.Set
	if err == nil {
		set, err = r.Set()
	}
	if err != nil {
		w.refuse(r, err)
		return
	}
	w.update(func(s *State) { s.Staged, s.StagedRev = set, r })
	w.applied(r, set)
}

// update changes the State and notifies the subscribers.
func (w *Watcher) update(f func(*State)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(&w.state)
	for ch := range w.subs {
		select {
		case *ch <- struct{}{}:
		default: // a notification is already pending
		}
	}
}

func (w *Watcher) applied(r Revision, set *policy.Set) {
	msg := "policy applied"
	if r.Key == KeyStaged {
		msg = "staged policy applied (evaluated, not enforced)"
	}
	w.cfg.Logger.Info(msg, "bucket", r.Bucket, "key", r.Key, "revision", r.Revision, "version", set.Version(),
		"rules", len(set.Rules()), "op", r.Op, "author", r.Author, "time", r.Time)
	if w.cfg.OnApplied != nil {
		w.cfg.OnApplied(r)
	}
}

// refuse logs every problem of a refused revision, once (a revision is
// handled once), and calls OnRefused.
func (w *Watcher) refuse(r Revision, err error) {
	keep := w.State().EnforcedRev.Revision
	attrs := []any{"bucket", r.Bucket, "key", r.Key, "revision", r.Revision, "author", r.Author, "running_revision", keep}
	const msg = "policy revision refused; the running policy stays"
	var es policy.Errors
	if errors.As(err, &es) {
		ruleName := ruleNamer(r.Source)
		for _, e := range es {
			w.cfg.Logger.Error(msg, append(attrs, "line", e.Line, "field", e.Field,
				"rule", ruleName(e.Field), "problem", e.Msg)...)
		}
	} else {
		w.cfg.Logger.Error(msg, append(attrs, "err", err)...)
	}
	if w.cfg.OnRefused != nil {
		w.cfg.OnRefused(r, err)
	}
}
