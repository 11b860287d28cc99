package kvstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The keys of the bucket.
const (
	// KeyEnforced holds the policy regiond enforces.
	KeyEnforced = "enforced"
	// KeyStaged holds a policy staged with Meta.Shadow, until Promote or
	// Unstage leaves a delete marker in its place.
	KeyStaged = "staged"
)

const (
	// DefaultBucket is Config.Bucket's default.
	DefaultBucket = "ration-policy"
	// History is how many revisions of each key the bucket keeps: the
	// JetStream key-value maximum. Older ones are gone for good.
	History = jetstream.KeyValueMaxHistory
	// MaxDocument is the largest policy document the store accepts, in
	// bytes; a bigger one is refused (ErrTooLarge) before anything is
	// written.
	MaxDocument = 1 << 20
	// maxValue bounds the bucket's values: a MaxDocument document and its
	// diff, JSON-escaped. The NATS server's max_payload (1 MiB by default)
	// is usually the tighter bound; Push checks it.
	maxValue = 8 << 20
)

// Sentinel errors. They are wrapped with detail; test with errors.Is.
var (
	// ErrInvalidConfig is wrapped by Open's and Validate's errors for a
	// Config that cannot be used.
	ErrInvalidConfig = errors.New("kvstore: invalid config")
	// ErrNoPolicy means the bucket has no enforced revision (or, with
	// Config.NoCreate, no bucket at all).
	ErrNoPolicy = errors.New("kvstore: no enforced policy")
	// ErrNoStaged means the bucket has no staged revision.
	ErrNoStaged = errors.New("kvstore: no staged policy")
	// ErrNoRevision means the bucket does not hold a policy at that
	// revision: it never existed, is older than the kept History, or
	// removes a key rather than holding a document.
	ErrNoRevision = errors.New("kvstore: no such revision")
	// ErrUnchanged means a write would enforce (or stage) a policy whose
	// Version equals the one already there; nothing was written.
	ErrUnchanged = errors.New("kvstore: no change")
	// ErrConflict means the key was written by someone else between the
	// read and the write of an operation; nothing was written. Read again
	// and retry.
	ErrConflict = errors.New("kvstore: concurrent write")
	// ErrTooLarge means a document is larger than MaxDocument, or its
	// value larger than the NATS server accepts; nothing was written.
	ErrTooLarge = errors.New("kvstore: too large")
	// ErrFormat means a value is an envelope this version cannot read (a
	// newer format, or a malformed one).
	ErrFormat = errors.New("kvstore: unreadable value")
)

// Config configures a Store.
type Config struct {
	// Conn is the NATS connection, owned by the caller. Required.
	Conn *nats.Conn
	// Bucket is the key-value bucket's name ([A-Za-z0-9_-]+). Default
	// DefaultBucket.
	Bucket string
	// Replicas is how many copies JetStream keeps of the bucket when Open
	// creates it: 1 to 5, default 1. Use the size of the JetStream
	// cluster (3 for a three-node cluster) so that the policy survives a
	// node. It does not change an existing bucket.
	Replicas int
	// NoCreate makes Open fail with ErrNoPolicy instead of creating a
	// missing bucket: for readers (regiond), whose permissions do not
	// allow creating it. Default false.
	NoCreate bool
	// Logger receives what the Store and its Watchers notice. Default
	// slog.Default().
	Logger *slog.Logger
}

var validBucket = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// ValidBucket reports whether name can name the policy store's bucket:
// letters, digits, '-' and '_'.
func ValidBucket(name string) bool { return validBucket.MatchString(name) }

// MaxReplicas is the most replicas a bucket may have (JetStream's).
const MaxReplicas = 5

func (c Config) withDefaults() Config {
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports whether c, with its defaults filled, is usable by
// Open. The error wraps ErrInvalidConfig.
func (c Config) Validate() error { return c.withDefaults().validate() }

func (c Config) validate() error {
	switch {
	case c.Conn == nil:
		return fmt.Errorf("%w: Conn is required", ErrInvalidConfig)
	case !ValidBucket(c.Bucket):
		return fmt.Errorf("%w: Bucket %q must match [A-Za-z0-9_-]+", ErrInvalidConfig, c.Bucket)
	case c.Replicas < 1 || c.Replicas > MaxReplicas:
		return fmt.Errorf("%w: Replicas must be 1 to %d (got %d)", ErrInvalidConfig, MaxReplicas, c.Replicas)
	}
	return nil
}

// Store is the policy bucket. Its methods are safe for concurrent use;
// each one is a few JetStream requests bounded by its ctx (and, for a ctx
// without a deadline, by the client's default of 5s a request).
type Store struct {
	cfg Config
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	now func() time.Time // time.Now; tests replace it
	// beforeWrite, when set (by tests), runs between an operation's reads
	// and its write.
	beforeWrite func()
}

// Open binds the bucket, creating it if it is missing (unless
// Config.NoCreate): History revisions a key, file storage,
// Config.Replicas copies. An error that is not ErrInvalidConfig or
// ErrNoPolicy means JetStream could not be reached or refused.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, fmt.Errorf("kvstore: %w", err)
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) && cfg.NoCreate:
		return nil, fmt.Errorf("%w: bucket %s does not exist", ErrNoPolicy, cfg.Bucket)
	case errors.Is(err, jetstream.ErrBucketNotFound):
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:       cfg.Bucket,
			Description:  "ration policy: enforced and staged revisions (policy/kvstore)",
			History:      History,
			MaxValueSize: maxValue,
			Storage:      jetstream.FileStorage,
			Replicas:     cfg.Replicas,
		})
		if err != nil {
			return nil, fmt.Errorf("kvstore: creating bucket %s: %w", cfg.Bucket, err)
		}
		cfg.Logger.Info("policy bucket created", "bucket", cfg.Bucket, "replicas", cfg.Replicas, "history", History)
	case err != nil:
		return nil, fmt.Errorf("kvstore: bucket %s: %w", cfg.Bucket, err)
	}
	return &Store{cfg: cfg, js: js, kv: kv, now: time.Now}, nil
}

// Bucket is the bucket's name.
func (s *Store) Bucket() string { return s.cfg.Bucket }

// Current returns the enforced revision, or ErrNoPolicy. A value that
// cannot be decoded gives ErrFormat with the Revision holding it raw.
func (s *Store) Current(ctx context.Context) (Revision, error) {
	r, found, err := s.latest(ctx, KeyEnforced)
	if err == nil && !found {
		err = ErrNoPolicy
	}
	return r, err
}

// Staged returns the staged revision, or ErrNoStaged.
func (s *Store) Staged(ctx context.Context) (Revision, error) {
	r, found, err := s.latest(ctx, KeyStaged)
	if err == nil && !found {
		err = ErrNoStaged
	}
	return r, err
}

// latest reads a key's latest value; found is false when the key is
// absent or deleted.
func (s *Store) latest(ctx context.Context, key string) (r Revision, found bool, err error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Revision{}, false, nil
	}
	if err != nil {
		return Revision{}, false, fmt.Errorf("kvstore: reading %s: %w", key, err)
	}
	r, err = s.revisionOf(e)
	return r, true, err
}

// Get returns the policy at revision rev, of either key, or
// ErrNoRevision.
func (s *Store) Get(ctx context.Context, rev uint64) (Revision, error) {
	if rev == 0 {
		return Revision{}, fmt.Errorf("%w: revisions start at 1", ErrNoRevision)
	}
	for _, key := range []string{KeyEnforced, KeyStaged} {
		e, err := s.kv.GetRevision(ctx, key, rev)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return Revision{}, fmt.Errorf("kvstore: reading revision %d: %w", rev, err)
		}
		return s.revisionOf(e)
	}
	return Revision{}, fmt.Errorf("%w: the bucket holds no policy at revision %d", ErrNoRevision, rev)
}

// History returns every kept revision of both keys, oldest first,
// delete markers included (Revision.Deleted). A value that cannot be
// decoded is listed raw, with Op "unreadable" and the problem as its
// Message, so that one bad value does not hide the others.
func (s *Store) History(ctx context.Context) ([]Revision, error) {
	w, err := s.kv.WatchFiltered(ctx, []string{KeyEnforced, KeyStaged}, jetstream.IncludeHistory())
	if err != nil {
		return nil, fmt.Errorf("kvstore: history: %w", err)
	}
	defer stopWatch(w)
	var out []Revision
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kvstore: history: %w", ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("kvstore: history: the watch ended early")
			}
			if e == nil { // every kept revision delivered
				slices.SortFunc(out, func(a, b Revision) int { return cmpUint(a.Revision, b.Revision) })
				return out, nil
			}
			r, err := s.revisionOf(e)
			if err != nil {
				r.Op, r.Message = OpUnreadable, err.Error()
			}
			out = append(out, r)
		}
	}
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// stopWatch stops a key watcher and drains its channel until the client
// closes it, so that the client's delivery goroutine, which blocks on a
// full channel, is never left blocked. The drain is bounded in case the
// channel is never closed.
func stopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-t.C:
			return
		}
	}
}

// revisionOf decodes an entry. On error the Revision still has the
// entry's metadata and its value as a raw Source.
func (s *Store) revisionOf(e jetstream.KeyValueEntry) (Revision, error) {
	r := Revision{Bucket: s.cfg.Bucket, Revision: e.Revision(), Key: e.Key(), Time: e.Created().UTC()}
	deleted := e.Operation() != jetstream.KeyValuePut
	if err := r.decode(e.Value(), deleted); err != nil {
		return r, fmt.Errorf("kvstore: revision %d of %s: %w", r.Revision, r.Key, err)
	}
	if r.Raw && deleted {
		r.Op = OpDelete
		if e.Operation() == jetstream.KeyValuePurge {
			r.Op = OpPurge
		}
	}
	return r, nil
}
