package agent

import (
	"context"
	"errors"
	"io"
	"time"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// watchPolicy keeps the agent's policy in step with the region's: it
// follows the WatchPolicy stream, parses each snapshot with the same policy
// package that validated it in regiond, and reconnects with a capped
// exponential backoff when the stream breaks. A snapshot that does not parse
// (a newer policy format than this agent knows, say) is logged and the
// previous policy stays in force.
func (a *Agent) watchPolicy(run context.Context) {
	defer a.wg.Done()
	follow(run, func() (bool, bool) { return a.followPolicy(run), false })
}

// follow runs one stream with stream until run is done or stream says to
// stop, again after a capped exponential backoff whenever it ends; a stream
// that delivered something resets the backoff.
func follow(run context.Context, stream func() (got, stop bool)) {
	const minBackoff, maxBackoff = 10 * time.Millisecond, 2 * time.Second
	backoff := minBackoff
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for {
		got, stop := stream()
		if got {
			backoff = minBackoff
		}
		if stop || run.Err() != nil {
			return
		}
		t.Reset(backoff)
		select {
		case <-run.Done():
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// followPolicy reads one WatchPolicy stream until it ends or run is done,
// and reports whether it delivered any snapshot.
func (a *Agent) followPolicy(run context.Context) (got bool) {
	stream, err := a.client.WatchPolicy(run, &leasev1.WatchPolicyRequest{Agent: a.c.agent()})
	if err != nil {
		return false
	}
	for {
		snap, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) && run.Err() == nil {
				a.cfg.Logger.Debug("policy stream ended", "err", err)
			}
			return got
		}
		got = true
		if cur := a.c.policy(); cur != nil && cur.Version() == snap.GetVersion() {
			continue
		}
		set, err := policy.Parse("region "+snap.GetRegion()+" policy "+snap.GetVersion(), snap.GetYaml())
		if err != nil {
			a.c.policyRefused()
			a.cfg.Logger.Error("policy from the region does not parse; keeping the previous one",
				"version", snap.GetVersion(), "err", err)
			continue
		}
		a.c.setPolicy(set)
		a.cfg.Logger.Info("policy applied", "version", set.Version(), "region", snap.GetRegion(), "rules", len(set.Rules()))
		a.readyOnce.Do(func() { close(a.ready) })
	}
}

// watchDry follows the region's WatchDry stream, reconnecting with a capped
// backoff, and makes each key a notice names deny locally until its bucket
// can grant (noteDry). A region too old to stream notices answers
// Unimplemented: the agent then stops asking.
func (a *Agent) watchDry(run context.Context) {
	defer a.wg.Done()
	follow(run, func() (got, stop bool) {
		stream, err := a.client.WatchDry(run, &leasev1.WatchDryRequest{Agent: a.c.agent()})
		for err == nil {
			var n *leasev1.DryNotice
			if n, err = stream.Recv(); err == nil {
				got = true
				now := a.now()
				for _, k := range n.GetKeys() {
					a.c.noteDry(k.GetRule(), k.GetKey(), k.GetRetryAfter().AsDuration(), now)
				}
			}
		}
		return got, status.Code(err) == codes.Unimplemented
	})
}

// noteDry applies the region's notice that key of rule cannot be granted
// for retry: a key this agent holds denies locally until then (a fixed
// window's entry never past its window), as if its own ask had been
// denied; a key it does not hold is not created. Live leased tokens are
// still spent first. It reports whether the key was held.
func (c *core) noteDry(rule, key string, retry time.Duration, now int64) bool {
	if retry <= 0 || len(rule)+1+len(key) > 1<<12 {
		return false
	}
	var buf [256]byte
	id := append(append(append(buf[:0], rule...), 0), key...)
	k := c.keys.get(id)
	if k == nil || k.isEvicted() {
		return false
	}
	du := now + int64(retry)
	if r := c.policy().Rule(rule); r != nil && r.FixedWindow() {
		_, end := c.windowAt(r, c.windowOf(r), now)
		du = min(du, end)
	}
	k.rareState() // before the deny cache entry: see keyRare.denied
	for {
		old := k.denyUntil.Load()
		if old >= du || k.denyUntil.CompareAndSwap(old, du) {
			return true
		}
	}
}
