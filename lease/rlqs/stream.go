package rlqs

import (
	"context"
	"errors"
	"io"
	"strconv"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leasev1 "github.com/ration-dev/ration/lease/v1"
)

// maxItems is the most items one lease call carries (the lease service's
// default MaxItems).
const maxItems = 1000

// maxKeyLen is the longest rule key leased (the lease service's default
// MaxKeyLen): a longer one would fail the whole batch.
const maxKeyLen = 1024

// stream is one proxy's stream: the edge of its Core, owned by the
// stream's handler goroutine, which carries the Core's calls to the
// Leaser and its responses to the proxy.
type stream struct {
	s    *Server
	srv  rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer
	core *Core
}

// StreamRateLimitQuotas implements rlqsv3.RateLimitQuotaServiceServer.
func (s *Server) StreamRateLimitQuotas(srv rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	if !s.enter() {
		return status.Error(codes.Unavailable, "rlqs: shutting down")
	}
	defer s.wg.Done()
	s.met.streams.Inc()
	defer s.met.streams.Dec()
	ctx := srv.Context()
	st := &stream{s: s, srv: srv,
		core: newCore(s.cfg, s.met, &s.fair, "rlqs/"+strconv.FormatUint(s.seq.Add(1), 10), s.cfg.Clock())}
	defer st.release()

	// Recv blocks, so a goroutine reads; it ends when the stream does,
	// which is at the latest when this handler returns.
	reports := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	recvErr := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			m, err := srv.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reports <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	tick := time.NewTicker(s.cfg.KeepAlive)
	defer tick.Stop()
	for {
		select {
		case m := <-reports:
			out, err := st.core.Report(s.cfg.Clock(), s.cfg.Leaser.Policy(), m)
			if err != nil {
				return err
			}
			if err := st.carry(ctx, out); err != nil {
				return err
			}
		case <-tick.C:
			if err := st.carry(ctx, st.core.Tick(s.cfg.Clock(), s.cfg.Leaser.Policy())); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-s.done:
			if m := st.core.Expire(); m != nil {
				_ = srv.Send(m)
			}
			return status.Error(codes.Unavailable, "rlqs: server shutting down")
		}
	}
}

// carry makes the calls of a Core's round, in its order, and sends its
// response.
func (st *stream) carry(ctx context.Context, out Outbox) error {
	for {
		st.giveBack(ctx, out.Returns)
		if out.Lease == nil {
			break
		}
		cctx, cancel := context.WithTimeout(ctx, st.s.cfg.LeaseTimeout)
		resp, err := st.s.cfg.Leaser.Lease(cctx, out.Lease)
		cancel()
		out = st.core.Leased(resp, err)
	}
	if out.Response == nil {
		return nil
	}
	return st.srv.Send(out.Response)
}

// release, when the stream ends, gives back the tokens debited and not
// given to the proxy.
func (st *stream) release() {
	// The stream's context is done, but its values (the caller's identity,
	// for a rule's clients) still hold.
	st.giveBack(context.WithoutCancel(st.srv.Context()), st.core.Release())
}

// giveBack credits tokens back to the store; a failure only costs
// utilisation, so it is logged.
func (st *stream) giveBack(ctx context.Context, reqs []*leasev1.ReturnRequest) {
	for _, req := range reqs {
		var total int64
		for _, it := range req.GetItems() {
			total += it.GetTokens()
		}
		cctx, cancel := context.WithTimeout(ctx, st.s.cfg.LeaseTimeout)
		_, err := st.s.cfg.Leaser.Return(cctx, req)
		cancel()
		if err != nil {
			st.s.cfg.Logger.Warn("rlqs: returning unused tokens failed", "tokens", total, "err", err)
			continue
		}
		st.s.met.returned.Add(float64(total))
	}
}
