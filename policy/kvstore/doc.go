// Package kvstore keeps ration's policy in a NATS JetStream key-value
// bucket, versioned, so that every region enforces the same document and
// an operator can see, diff and roll back what was pushed (DESIGN.md,
// "Policy").
//
// The bucket holds two keys: enforced, the policy regiond enforces, and
// staged, a candidate pushed with Meta.Shadow for regiond to evaluate
// without enforcing it. A key's revision is the bucket stream's sequence
// number, which is the policy's revision. Each value is a JSON envelope
// (who, when, why, the diff, the YAML); a plain YAML value put with the
// nats CLI is read too, with an unknown author. The bucket keeps the last
// 64 revisions of each key (JetStream's most).
//
// The writer (cmd/ration) opens a Store and pushes:
//
//	st, err := kvstore.Open(ctx, kvstore.Config{Conn: nc})
//	rev, err := st.Push(ctx, yaml, kvstore.Meta{Author: "alice", Message: "raise acme"})
//
// regiond follows it with a Watcher, which applies each valid revision
// and refuses, keeping the running policy, any that does not validate:
//
//	w, err := kvstore.NewWatcher(ctx, st, kvstore.WatcherConfig{})
//	go w.Run(ctx) // owned by the caller, which waits for it
//	state := w.State()
package kvstore
