package kvstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ration-dev/ration/policy"
)

// Meta is who writes a revision, and why.
type Meta struct {
	// Author is the writer's identity, verified by NATS where it can be.
	Author string
	// ClaimedAuthor is the name the writer gave, recorded when it differs
	// from Author.
	ClaimedAuthor string
	// Message says why (like a commit message).
	Message string
	// Shadow makes Push stage the document (KeyStaged) instead of
	// enforcing it. Other operations ignore it.
	Shadow bool
}

// headroom is what a value leaves of the server's max_payload for the
// message's subject and headers.
const headroom = 1024

// Push validates doc and writes it as a new revision: of KeyEnforced, or
// with m.Shadow of KeyStaged. The revision's Diff is against the enforced
// revision. Nothing is written when doc is larger than MaxDocument
// (ErrTooLarge), does not validate (policy.Errors, wrapping
// policy.ErrInvalid), or means the same as the revision it would replace
// or, staged, as the enforced one (ErrUnchanged, returned with that
// revision); or when the key is written by someone else meanwhile
// (ErrConflict).
func (s *Store) Push(ctx context.Context, doc []byte, m Meta) (Revision, error) {
	if len(doc) > MaxDocument {
		return Revision{}, fmt.Errorf("%w: the document is %d bytes; the store takes at most %d (1 MiB)", ErrTooLarge, len(doc), MaxDocument)
	}
	set, err := policy.Parse("nats-kv://"+s.cfg.Bucket+" push", doc)
	if err != nil {
		return Revision{}, err
	}
	enf, enfFound, err := s.readForWrite(ctx, KeyEnforced)
	if err != nil {
		return Revision{}, err
	}
	key, op, last, lastFound := KeyEnforced, OpPush, enf, enfFound
	if m.Shadow {
		key, op = KeyStaged, OpStage
		if last, lastFound, err = s.readForWrite(ctx, KeyStaged); err != nil {
			return Revision{}, err
		}
		if lastFound && sameVersion(last, set) {
			return last, fmt.Errorf("%w: staged revision %d already has version %s", ErrUnchanged, last.Revision, set.Version())
		}
	}
	if enfFound && sameVersion(enf, set) {
		return enf, fmt.Errorf("%w: enforced revision %d already has version %s", ErrUnchanged, enf.Revision, set.Version())
	}
	r := Revision{Op: op, Source: doc, Version: set.Version(), Diff: Diff(enf.Source, doc)}
	return s.write(ctx, key, r, m, last.Revision, lastFound)
}

// Rollback enforces the document of revision rev again, as a new
// revision with Op OpRollback. It refuses a revision it does not hold
// (ErrNoRevision), whose document does not validate (policy.Errors), or
// that means the same as the enforced one (ErrUnchanged).
func (s *Store) Rollback(ctx context.Context, rev uint64, m Meta) (Revision, error) {
	old, err := s.Get(ctx, rev)
	if err != nil {
		return Revision{}, err
	}
	if len(old.Source) > MaxDocument {
		return Revision{}, fmt.Errorf("%w: revision %d is %d bytes; the store takes at most %d (1 MiB)", ErrTooLarge, rev, len(old.Source), MaxDocument)
	}
	set, err := old.Set()
	if err != nil {
		return Revision{}, fmt.Errorf("kvstore: revision %d cannot be enforced again: %w", rev, err)
	}
	enf, found, err := s.readForWrite(ctx, KeyEnforced)
	if err != nil {
		return Revision{}, err
	}
	if found && sameVersion(enf, set) {
		return enf, fmt.Errorf("%w: enforced revision %d already has version %s", ErrUnchanged, enf.Revision, set.Version())
	}
	r := Revision{Op: OpRollback, FromRevision: rev, Source: old.Source, Version: set.Version(), Diff: Diff(enf.Source, old.Source)}
	return s.write(ctx, KeyEnforced, r, m, enf.Revision, found)
}

// Promote enforces the staged document as a new revision with Op
// OpPromote, then removes it from KeyStaged with a delete marker. It
// refuses when nothing is staged (ErrNoStaged), the staged document does
// not validate (policy.Errors), or it means the same as the enforced one
// (ErrUnchanged: Unstage it). A staged revision replaced between the two
// writes stays staged (logged). An m.Message of "" keeps the staged
// revision's.
func (s *Store) Promote(ctx context.Context, m Meta) (Revision, error) {
	st, found, err := s.latest(ctx, KeyStaged)
	switch {
	case err != nil:
		return Revision{}, err
	case !found:
		return Revision{}, ErrNoStaged
	}
	set, err := st.Set()
	if err != nil {
		return Revision{}, fmt.Errorf("kvstore: staged revision %d cannot be enforced: %w", st.Revision, err)
	}
	enf, enfFound, err := s.readForWrite(ctx, KeyEnforced)
	if err != nil {
		return Revision{}, err
	}
	if enfFound && sameVersion(enf, set) {
		return enf, fmt.Errorf("%w: staged revision %d means the same as enforced revision %d; unstage it", ErrUnchanged, st.Revision, enf.Revision)
	}
	if m.Message == "" {
		m.Message = st.Message
	}
	r := Revision{Op: OpPromote, FromRevision: st.Revision, Source: st.Source, Version: set.Version(), Diff: Diff(enf.Source, st.Source)}
	out, err := s.write(ctx, KeyEnforced, r, m, enf.Revision, enfFound)
	if err != nil {
		return Revision{}, err
	}
	_, err = s.writeMarker(ctx, Revision{Op: OpPromote, FromRevision: st.Revision}, m, st.Revision)
	switch {
	case errors.Is(err, ErrConflict):
		s.cfg.Logger.Warn("policy promoted, but the staged key was written meanwhile and stays staged",
			"bucket", s.cfg.Bucket, "promoted", st.Revision, "revision", out.Revision)
	case err != nil:
		return out, fmt.Errorf("kvstore: staged revision %d is enforced as revision %d, but removing it from staged failed (unstage removes it): %w", st.Revision, out.Revision, err)
	}
	return out, nil
}

// Unstage removes the staged revision, unenforced: a delete marker of
// KeyStaged with Op OpUnstage and FromRevision the revision removed, which
// it returns. ErrNoStaged when nothing is staged; ErrConflict when the
// staged key is written meanwhile. A staged value that cannot be decoded
// may be unstaged too.
func (s *Store) Unstage(ctx context.Context, m Meta) (Revision, error) {
	st, found, err := s.readForWrite(ctx, KeyStaged)
	switch {
	case err != nil:
		return Revision{}, err
	case !found:
		return Revision{}, ErrNoStaged
	}
	return s.writeMarker(ctx, Revision{Op: OpUnstage, FromRevision: st.Revision}, m, st.Revision)
}

// readForWrite is latest for a key about to be replaced: a value that
// cannot be decoded is no obstacle to replacing it.
func (s *Store) readForWrite(ctx context.Context, key string) (Revision, bool, error) {
	r, found, err := s.latest(ctx, key)
	if errors.Is(err, ErrFormat) {
		s.cfg.Logger.Warn("replacing a policy revision that cannot be decoded", "bucket", s.cfg.Bucket, "key", key, "revision", r.Revision, "err", err)
		r.Source, err = nil, nil
	}
	return r, found, err
}

func sameVersion(r Revision, set *policy.Set) bool {
	cur, err := r.Set()
	return err == nil && cur.Version() == set.Version()
}

// write fills r's metadata from m and writes it to key: an update of
// revision expect when the key exists, else a create.
func (s *Store) write(ctx context.Context, key string, r Revision, m Meta, expect uint64, exists bool) (Revision, error) {
	value, err := s.prepare(&r, key, m)
	if err != nil {
		return Revision{}, err
	}
	if exists {
		r.Revision, err = s.kv.Update(ctx, key, value, expect)
	} else {
		r.Revision, err = s.kv.Create(ctx, key, value)
	}
	if err != nil {
		return Revision{}, writeErr(key, err)
	}
	s.logWrite(r)
	return r, nil
}

// writeMarker writes a delete marker of KeyStaged whose body is r's
// envelope, if the key's last revision is expect. (KeyValue.Delete writes
// no body; the body keeps who removed the staged policy, and why.)
func (s *Store) writeMarker(ctx context.Context, r Revision, m Meta, expect uint64) (Revision, error) {
	value, err := s.prepare(&r, KeyStaged, m)
	if err != nil {
		return Revision{}, err
	}
	msg := nats.NewMsg("$KV." + s.cfg.Bucket + "." + KeyStaged)
	msg.Header.Set("KV-Operation", "DEL")
	msg.Data = value
	ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(expect))
	if err != nil {
		return Revision{}, writeErr(KeyStaged, err)
	}
	r.Revision, r.Deleted = ack.Sequence, true
	s.logWrite(r)
	return r, nil
}

// prepare completes r for key and m and encodes it, within what the NATS
// server accepts: without its diff if need be, else ErrTooLarge.
func (s *Store) prepare(r *Revision, key string, m Meta) ([]byte, error) {
	r.Bucket, r.Key = s.cfg.Bucket, key
	r.Author, r.ClaimedAuthor, r.Message = m.Author, m.ClaimedAuthor, m.Message
	if r.ClaimedAuthor == r.Author {
		r.ClaimedAuthor = ""
	}
	r.Time = s.now().UTC()
	limit := int64(maxValue)
	if p := s.cfg.Conn.MaxPayload(); p > 0 {
		limit = min(limit, p-headroom)
	}
	if len(r.Diff) > MaxDocument {
		r.Diff = ""
	}
	value, err := r.encode()
	if err == nil && int64(len(value)) > limit && r.Diff != "" {
		r.Diff = ""
		value, err = r.encode()
	}
	switch {
	case err != nil:
		return nil, err
	case int64(len(value)) > limit:
		return nil, fmt.Errorf("%w: the revision is %d bytes encoded; the NATS server takes at most %d (max_payload less headers): raise max_payload or shrink the document",
			ErrTooLarge, len(value), limit)
	}
	if s.beforeWrite != nil {
		s.beforeWrite()
	}
	return value, nil
}

func (s *Store) logWrite(r Revision) {
	s.cfg.Logger.Info("policy revision written", "bucket", r.Bucket, "key", r.Key, "revision", r.Revision,
		"op", r.Op, "version", r.Version, "author", r.Author)
}

// writeErr maps a failed write: a revision mismatch is ErrConflict.
func writeErr(key string, err error) error {
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) ||
		(errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)) {
		return fmt.Errorf("%w: %s was written by someone else meanwhile: %w", ErrConflict, key, err)
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Errorf("%w: %w", ErrTooLarge, err)
	}
	return fmt.Errorf("kvstore: writing %s: %w", key, err)
}
