package kvstore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ration-dev/ration/policy"
)

// Format is the envelope's format field.
const Format = "ration-policy/v1"

// The operations a revision records (Revision.Op).
const (
	// OpPush is a document pushed to enforced, or staged with Shadow.
	OpPush = "push"
	// OpRollback puts an older revision's document back (FromRevision).
	OpRollback = "rollback"
	// OpStage is a document pushed to staged (Meta.Shadow).
	OpStage = "stage"
	// OpPromote enforces the staged document (FromRevision); it also marks
	// the staged key's removal.
	OpPromote = "promote"
	// OpUnstage removes the staged document (FromRevision) unenforced.
	OpUnstage = "unstage"

	// OpPut is a value that is not an envelope: YAML put with the nats CLI.
	OpPut = "put"
	// OpDelete and OpPurge are delete markers that are not envelopes
	// (nats kv del, nats kv purge).
	OpDelete = "delete"
	OpPurge  = "purge"
	// OpUnreadable is a value History could not decode.
	OpUnreadable = "unreadable"
)

var envelopeOps = map[string]bool{OpPush: true, OpRollback: true, OpStage: true, OpPromote: true, OpUnstage: true}

// Revision is one revision of a key of the bucket.
type Revision struct {
	// Bucket and Key locate it; Revision is its number, the bucket
	// stream's sequence, shared by both keys.
	Bucket   string
	Key      string
	Revision uint64
	// Op is what wrote it: one of the Op constants.
	Op string
	// Author is who wrote it as the writer knew them: a NATS identity when
	// the server authenticated the writer, else what the writer claimed.
	// Empty when unknown (a value that is not an envelope).
	Author string
	// ClaimedAuthor is the name the writer gave (ration -author) when it
	// differs from Author.
	ClaimedAuthor string
	// Message says why.
	Message string
	// Version is the policy's Set.Version as the writer computed it.
	// Empty for a raw value and a delete marker.
	Version string
	// Diff is the unified diff (Diff) of Source against the enforced
	// revision before it, when it was written. Empty when the writer
	// stored none (the diff would have made the value too large).
	Diff string
	// FromRevision is, for a rollback or promote, the revision whose
	// document it copies; for an unstage, the staged revision it removes.
	FromRevision uint64
	// Time is when it was written: the envelope's time (the writer's
	// clock), or the NATS server's for a raw value.
	Time time.Time
	// Source is the YAML document; empty for a delete marker.
	Source []byte
	// Raw is set for a value that is not an envelope: Source is the value.
	Raw bool
	// Deleted is set for a delete marker: the revision removes the key.
	Deleted bool
}

// Name is how messages name the revision, like
// "nats-kv://ration-policy revision 17"; it is the file name of Set's
// errors.
func (r Revision) Name() string {
	return "nats-kv://" + r.Bucket + " revision " + strconv.FormatUint(r.Revision, 10)
}

// Set parses and validates the revision's document. A bad document gives
// policy.Errors (wrapping policy.ErrInvalid) naming the revision; a delete
// marker gives ErrNoRevision.
func (r Revision) Set() (*policy.Set, error) {
	if r.Deleted {
		return nil, fmt.Errorf("%w: revision %d removes %s and holds no policy", ErrNoRevision, r.Revision, r.Key)
	}
	return policy.Parse(r.Name(), r.Source)
}

// envelope is a value as stored.
type envelope struct {
	Format        string `json:"format"`
	Author        string `json:"author"`
	ClaimedAuthor string `json:"claimed_author,omitempty"`
	Time          string `json:"time"`
	Message       string `json:"message"`
	Op            string `json:"op"`
	FromRevision  uint64 `json:"from_revision,omitempty"`
	Version       string `json:"version"`
	Diff          string `json:"diff"`
	Policy        string `json:"policy"`
}

// encode returns r's envelope (its metadata fields, not its location).
func (r Revision) encode() ([]byte, error) {
	if !utf8.Valid(r.Source) {
		return nil, fmt.Errorf("kvstore: the document is not valid UTF-8")
	}
	env := envelope{
		Format:       Format,
		Author:       r.Author,
		Time:         r.Time.UTC().Format(time.RFC3339Nano),
		Message:      r.Message,
		Op:           r.Op,
		FromRevision: r.FromRevision,
		Version:      r.Version,
		Diff:         r.Diff,
		Policy:       string(r.Source),
	}
	if r.ClaimedAuthor != r.Author {
		env.ClaimedAuthor = r.ClaimedAuthor
	}
	return json.Marshal(env)
}

// decode fills r's metadata and Source from a value; deleted says the
// value is a delete marker's. A value that is not a JSON object with a
// format field is raw: a document (or, for a marker, nothing), not an
// error. An object with another format, or a v1 envelope with bad
// fields, is ErrFormat.
func (r *Revision) decode(value []byte, deleted bool) error {
	r.Deleted = deleted
	var probe struct {
		Format *string `json:"format"`
	}
	trimmed := bytes.TrimLeft(value, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(value, &probe) != nil || probe.Format == nil {
		r.Raw = true
		r.Op = OpPut
		if !deleted {
			r.Source = value
		}
		return nil
	}
	if *probe.Format != Format {
		return fmt.Errorf("%w: envelope format %q (this version reads %q)", ErrFormat, *probe.Format, Format)
	}
	var env envelope
	if err := json.Unmarshal(value, &env); err != nil {
		return fmt.Errorf("%w: %w", ErrFormat, err)
	}
	if !envelopeOps[env.Op] {
		return fmt.Errorf("%w: unknown op %q", ErrFormat, env.Op)
	}
	t, err := time.Parse(time.RFC3339Nano, env.Time)
	if err != nil {
		return fmt.Errorf("%w: time: %w", ErrFormat, err)
	}
	if t = t.UTC(); t.Year() < 1 || t.Year() > 9999 {
		return fmt.Errorf("%w: time %s is out of range", ErrFormat, env.Time)
	}
	if env.ClaimedAuthor == env.Author {
		env.ClaimedAuthor = ""
	}
	r.Op, r.Author, r.ClaimedAuthor, r.Message = env.Op, env.Author, env.ClaimedAuthor, env.Message
	r.FromRevision, r.Version, r.Diff = env.FromRevision, env.Version, env.Diff
	r.Time = t
	r.Source = nil
	if env.Policy != "" {
		r.Source = []byte(env.Policy)
	}
	return nil
}
