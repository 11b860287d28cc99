package regiond

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/policy/kvstore"
)

// startPolicyStore opens the policy store's bucket on the daemon's NATS
// connection and follows it. With a revision enforced, it is applied before
// Start returns; with an empty bucket, regiond serves no rule (and is not
// ready) until the first push, which it watches for.
func (d *Daemon) startPolicyStore(ctx, runCtx context.Context) error {
	wcfg := kvstore.WatcherConfig{
		Logger: d.log,
		OnRefused: func(kvstore.Revision, error) {
			d.pol.met.refused.WithLabelValues("nats-kv").Inc()
		},
	}
	w, err := d.watchStore(ctx, wcfg)
	switch {
	case err == nil:
		d.followStore(runCtx, w)
		return nil
	case errors.Is(err, kvstore.ErrNoPolicy):
		d.log.Warn("the policy store holds no policy yet: no rule is served until one is pushed (ration policy push)", "policy", d.cfg.PolicyFile, "err", err)
		d.goRun("policy-store-wait", func() error {
			w, err := d.awaitPolicy(runCtx, wcfg)
			if err == nil && w != nil {
				d.followStore(runCtx, w)
			}
			return err
		})
		return nil
	default:
		return fmt.Errorf("regiond: policy store %s: %w", d.cfg.PolicyFile, err)
	}
}

// watchStore opens the bucket and loads its policy. A missing bucket is
// created when the NATS user may (a region user with only
// embedded.PolicyReader may not: it waits for the CLI to create it); the
// error of an empty or missing bucket wraps kvstore.ErrNoPolicy.
func (d *Daemon) watchStore(ctx context.Context, wcfg kvstore.WatcherConfig) (*kvstore.Watcher, error) {
	cfg := kvstore.Config{Conn: d.nc, Bucket: d.cfg.policyBucket(), Replicas: d.cfg.PolicyReplicas, NoCreate: true, Logger: d.log}
	st, err := kvstore.Open(ctx, cfg)
	if errors.Is(err, kvstore.ErrNoPolicy) {
		cfg.NoCreate = false
		var cerr error
		if st, cerr = kvstore.Open(ctx, cfg); cerr != nil {
			return nil, fmt.Errorf("%w (creating the bucket: %v)", err, cerr)
		}
	} else if err != nil {
		return nil, err
	}
	return kvstore.NewWatcher(ctx, st, wcfg)
}

// awaitPolicy retries watchStore every second until the bucket holds a
// policy, or runCtx ends (nil, nil).
func (d *Daemon) awaitPolicy(runCtx context.Context, wcfg kvstore.WatcherConfig) (*kvstore.Watcher, error) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-runCtx.Done():
			return nil, nil
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(runCtx, 5*time.Second)
		w, err := d.watchStore(ctx, wcfg)
		cancel()
		switch {
		case err == nil:
			return w, nil
		case errors.Is(err, kvstore.ErrNoPolicy), runCtx.Err() != nil:
		default:
			d.log.Warn("reading the policy store", "policy", d.cfg.PolicyFile, "err", err)
		}
	}
}

// followStore applies the watcher's state now and at every change, and runs
// the watcher.
func (d *Daemon) followStore(runCtx context.Context, w *kvstore.Watcher) {
	cur, changed, cancel := w.Subscribe()
	d.applyRevision(cur)
	d.goRun("policy-store", func() error { return w.Run(runCtx) })
	d.goRun("policy-apply", func() error {
		defer cancel()
		for {
			select {
			case <-runCtx.Done():
				return nil
			case <-changed:
				d.applyRevision(w.State())
			}
		}
	})
}

// applyRevision enforces a state of the policy store: its enforced
// revision, with a staged revision's changed rules beside it as shadow
// rules (policy.Stage).
func (d *Daemon) applyRevision(st kvstore.State) {
	set, name := st.Enforced, strconv.FormatUint(st.EnforcedRev.Revision, 10)
	if st.Staged != nil {
		staged, err := policy.Stage(st.Enforced, st.Staged)
		if err != nil {
			d.log.Error("policy: cannot stage the staged revision; enforcing without it", "revision", st.StagedRev.Revision, "err", err)
			d.pol.met.refused.WithLabelValues("nats-kv").Inc()
		} else {
			set, name = staged, name+"+staged "+strconv.FormatUint(st.StagedRev.Revision, 10)
		}
	}
	if set == nil {
		return
	}
	if old := d.pol.Base(); old == set {
		return
	}
	d.pol.setBase(set, name)
	d.pol.met.revision.Set(float64(st.EnforcedRev.Revision))
	d.rev.Store(st.EnforcedRev.Revision)
	args := []any{"revision", st.EnforcedRev.Revision, "version", st.Enforced.Version(), "rules", len(set.Rules()),
		"author", st.EnforcedRev.Author, "written", st.EnforcedRev.Time, "op", st.EnforcedRev.Op}
	if st.Staged != nil {
		args = append(args, "staged_revision", st.StagedRev.Revision)
	}
	d.log.Info("policy applied from the policy store", args...)
}

// PolicyRevision is the policy store's revision this daemon enforces (0
// without the store, or before its first revision).
func (d *Daemon) PolicyRevision() uint64 {
	return d.rev.Load()
}
