package agent

import (
	"context"
	"errors"
	"io"
	"time"

	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// watchPolicy keeps the agent's policy in step with the region's: it
// follows the WatchPolicy stream, parses each snapshot with the same policy
// package that validated it in regiond, and reconnects with a capped
// exponential backoff when the stream breaks. A snapshot that does not parse
// (a newer policy format than this agent knows, say) is logged and the
// previous policy stays in force.
func (a *Agent) watchPolicy(run context.Context) {
	defer a.wg.Done()
	const minBackoff, maxBackoff = 10 * time.Millisecond, 2 * time.Second
	backoff := minBackoff
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for {
		if got := a.followPolicy(run); got {
			backoff = minBackoff
		}
		if run.Err() != nil {
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
