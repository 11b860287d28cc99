// Package grpclimit is gRPC server middleware (unary and stream
// interceptors) that rate-limits calls with a ration agent.
//
// A call is described by its route (the full method, "/pkg.Service/Method"),
// its service ("pkg.Service"), the peer's IP, and chosen metadata entries.
// A denied call fails with codes.ResourceExhausted and a RetryInfo detail
// saying when to retry, plus a QuotaFailure naming the rule; a call denied
// because the region is unreachable and its rule fails closed fails with
// codes.Unavailable (the client is not over its quota), also with a
// RetryInfo. A stream is decided once, when it opens. Shadow rules never
// reject.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/policy"
)

// Decider decides a call: *agent.Agent.
type Decider interface {
	Allow(ctx context.Context, ds []policy.Descriptor, hits int64) agent.Decision
}

// Descriptor names of a call.
const (
	DescRoute   = "route"
	DescService = "service"
	DescIP      = "ip"
)

// Config configures the interceptors.
type Config struct {
	// Agent decides calls. Required.
	Agent Decider
	// Metadata maps incoming metadata keys (lower case, as gRPC keeps
	// them) to descriptor names: {"x-api-key": "api_key"} makes the first
	// x-api-key value the api_key descriptor.
	Metadata map[string]string
	// Extra, if set, appends more descriptors.
	Extra func(ctx context.Context, fullMethod string, dst []policy.Descriptor) []policy.Descriptor
	// Hits, if set, gives how many hits a call counts for. Default 1.
	Hits func(ctx context.Context, fullMethod string) int64
}

// ErrNoAgent is returned without Config.Agent.
var ErrNoAgent = errors.New("grpclimit: Config.Agent is required")

// Descriptors appends the descriptors of a call of fullMethod to dst.
func (c *Config) Descriptors(ctx context.Context, fullMethod string, dst []policy.Descriptor) []policy.Descriptor {
	service, _, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	dst = append(dst,
		policy.Descriptor{Key: DescRoute, Value: fullMethod},
		policy.Descriptor{Key: DescService, Value: service},
	)
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		host, _, err := net.SplitHostPort(p.Addr.String())
		if err != nil {
			host = p.Addr.String()
		}
		dst = append(dst, policy.Descriptor{Key: DescIP, Value: host})
	}
	if len(c.Metadata) > 0 {
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			for key, name := range c.Metadata {
				if vs := md.Get(key); len(vs) > 0 {
					dst = append(dst, policy.Descriptor{Key: name, Value: vs[0]})
				}
			}
		}
	}
	if c.Extra != nil {
		dst = c.Extra(ctx, fullMethod, dst)
	}
	return dst
}

// check decides a call and returns the status error of a denial, or nil.
func (c *Config) check(ctx context.Context, fullMethod string) error {
	var buf [8]policy.Descriptor
	ds := c.Descriptors(ctx, fullMethod, buf[:0])
	hits := int64(1)
	if c.Hits != nil {
		hits = c.Hits(ctx, fullMethod)
	}
	d := c.Agent.Allow(ctx, ds, hits)
	if d.Allowed {
		return nil
	}
	return DenialError(d)
}

// DenialError is the status error for a denied decision:
// ResourceExhausted with RetryInfo and QuotaFailure details, or Unavailable
// with RetryInfo when the rule failed closed.
func DenialError(d agent.Decision) error {
	code, msg := codes.ResourceExhausted, fmt.Sprintf("rate limit %q exceeded: %s", d.Rule, d.Quota())
	if d.Path == agent.PathFailedClosed {
		code, msg = codes.Unavailable, fmt.Sprintf("rate limiter cannot reach its region and rule %q fails closed", d.Rule)
	}
	details := []protoadapt.MessageV1{&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}}
	if code == codes.ResourceExhausted {
		details = append(details, &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject:     d.Rule,
			Description: msg,
		}}})
	}
	st, err := status.New(code, msg).WithDetails(details...)
	if err != nil { // only for details that cannot be marshalled
		return status.Error(code, msg)
	}
	return st.Err()
}

// UnaryServerInterceptor decides every unary call before its handler.
func UnaryServerInterceptor(cfg Config) (grpc.UnaryServerInterceptor, error) {
	if cfg.Agent == nil {
		return nil, ErrNoAgent
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := cfg.check(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}, nil
}

// StreamServerInterceptor decides every stream once, when it opens.
func StreamServerInterceptor(cfg Config) (grpc.StreamServerInterceptor, error) {
	if cfg.Agent == nil {
		return nil, ErrNoAgent
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := cfg.check(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}, nil
}
