package service

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/policy"
)

// Who may lease what: a rule's clients (policy.Rule.Clients) name the
// callers allowed to lease or return its keys, by the identity of their
// client certificate. A call with any item of a rule its caller may not use
// is refused whole with PermissionDenied, before the store, and counted.

// Identity returns the caller's identity in a lease API call: its verified
// client certificate's URI SAN, DNS name or common name (tlsfiles.Identity),
// "" for a caller without one.
func Identity(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return ""
	}
	return tlsfiles.Identity(ti.State)
}

// authorize refuses a call of rpc whose caller may not use one of rules.
func (s *Service) authorize(ctx context.Context, rpc string, rules []*policy.Rule) error {
	id, known := "", false
	for _, r := range rules {
		if len(r.Clients) == 0 {
			continue
		}
		if !known {
			id, known = Identity(ctx), true
		}
		if r.Allows(id) {
			continue
		}
		s.metrics.refused.WithLabelValues(rpc, r.Name, s.refusals.label(id)).Inc()
		if s.refusals.shouldLog(id, s.cfg.Clock()) {
			s.cfg.Logger.Warn("lease API: caller refused by a rule's clients", "rpc", rpc, "rule", r.Name, "client", id)
		}
		shown := id
		if shown == "" {
			shown = "(no client certificate)"
		}
		return status.Errorf(codes.PermissionDenied, "client %s may not use rule %q", shown, r.Name)
	}
	return nil
}

// maxClientLabels bounds the distinct client identities the refusal
// metric labels: the rest are "other", so a flood of identities costs
// bounded series.
const maxClientLabels = 64

// refusals keeps the refusal metric's client labels bounded and its log
// lines to one per identity per refusalLogEvery.
type refusals struct {
	mu     sync.Mutex
	labels map[string]bool
	logged map[string]time.Time
}

const refusalLogEvery = 10 * time.Second

func (r *refusals) label(id string) string {
	if id == "" {
		return "none"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.labels == nil {
		r.labels = make(map[string]bool)
	}
	if !r.labels[id] {
		if len(r.labels) >= maxClientLabels {
			return "other"
		}
		r.labels[id] = true
	}
	return id
}

func (r *refusals) shouldLog(id string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.logged == nil || len(r.logged) >= 4*maxClientLabels {
		r.logged = make(map[string]time.Time)
	}
	if last, ok := r.logged[id]; ok && now.Sub(last) < refusalLogEvery {
		return false
	}
	r.logged[id] = now
	return true
}
