// Package httplimit is net/http middleware that rate-limits requests with a
// ration agent.
//
// Each request is described by an Extractor (route, method, client IP, API
// key, user, plus whatever a function adds) and decided by the agent. Every
// decided response carries the quota of the rule that decided, in the IETF
// httpapi ratelimit-headers draft syntax and the legacy form:
//
//	RateLimit-Policy: "per-tenant";q=1000;w=1
//	RateLimit: "per-tenant";r=998;t=1
//	X-RateLimit-Limit: 1000
//	X-RateLimit-Remaining: 998
//	X-RateLimit-Reset: 1
//
// For a fixed window (algorithm: fixed_window), w is the length of the
// current window (90000 on a 25-hour day), t and X-RateLimit-Reset the
// seconds to its end, and a request the window has no tokens for gets a
// Retry-After of the seconds to its end:
//
//	RateLimit-Policy: "daily";q=1000;w=86400
//	RateLimit: "daily";r=0;t=30600
//	Retry-After: 30600
//
// A denied request gets 429 Too Many Requests with Retry-After and an
// application/problem+json body (RFC 9457); a request denied because the
// region is unreachable and its rule fails closed gets 503 Service
// Unavailable instead, since the client is not over its quota. Shadow rules
// never reject and add no headers.
package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/policy"
)

// Decider decides a request: *agent.Agent.
type Decider interface {
	Allow(ctx context.Context, ds []policy.Descriptor, hits int64) agent.Decision
}

// Descriptor names the Extractor produces.
const (
	DescRoute  = "route"
	DescMethod = "method"
	DescIP     = "ip"
	DescAPIKey = "api_key"
	DescUser   = "user"
)

// Extractor turns a request into descriptors. The zero value yields route
// (the ServeMux pattern that matched, else the URL path), method and ip (the
// peer address, forwarded headers ignored).
type Extractor struct {
	// APIKeyHeader, if set, names a header whose value becomes the api_key
	// descriptor (absent when the header is).
	APIKeyHeader string
	// UserHeader, if set, names a header whose value becomes the user
	// descriptor, for deployments where an authenticating proxy sets it.
	UserHeader string
	// TrustedProxies are the networks of the proxies in front of the
	// server (load balancers, CDNs' egress ranges). A request from one of
	// them has its client IP taken from Forwarded (RFC 7239) or
	// X-Forwarded-For: the rightmost address that is not a trusted proxy,
	// since a client can write anything on the left and would otherwise
	// pick its own rate-limit key. Empty: the peer address, forwarded
	// headers ignored.
	TrustedProxies []netip.Prefix
	// Route, if set, gives the route descriptor instead of the default.
	Route func(*http.Request) string
	// Extra, if set, appends more descriptors (a tenant from a token, say).
	Extra func(r *http.Request, dst []policy.Descriptor) []policy.Descriptor
}

// Descriptors appends r's descriptors to dst.
func (e *Extractor) Descriptors(r *http.Request, dst []policy.Descriptor) []policy.Descriptor {
	route := r.Pattern
	if e.Route != nil {
		route = e.Route(r)
	} else if route == "" {
		route = r.URL.Path
	}
	dst = append(dst,
		policy.Descriptor{Key: DescRoute, Value: route},
		policy.Descriptor{Key: DescMethod, Value: r.Method},
		policy.Descriptor{Key: DescIP, Value: e.clientIP(r)},
	)
	if e.APIKeyHeader != "" {
		if v := r.Header.Get(e.APIKeyHeader); v != "" {
			dst = append(dst, policy.Descriptor{Key: DescAPIKey, Value: v})
		}
	}
	if e.UserHeader != "" {
		if v := r.Header.Get(e.UserHeader); v != "" {
			dst = append(dst, policy.Descriptor{Key: DescUser, Value: v})
		}
	}
	if e.Extra != nil {
		dst = e.Extra(r, dst)
	}
	return dst
}

// Config configures the middleware.
type Config struct {
	// Agent decides requests. Required.
	Agent Decider
	// Extractor describes requests; the zero value is documented there.
	Extractor Extractor
	// Hits, if set, gives how many hits a request counts for (the rule's
	// cost is per hit). Default 1.
	Hits func(*http.Request) int64
	// ProblemType is the "type" URI of problem+json bodies. Default
	// "about:blank", which RFC 9457 defines as "the status code says it".
	ProblemType string
}

// ErrNoAgent is returned by New without Config.Agent.
var ErrNoAgent = errors.New("httplimit: Config.Agent is required")

// withDefaults returns a copy of c with every zero optional field set to its
// default.
func (c Config) withDefaults() Config {
	if c.ProblemType == "" {
		c.ProblemType = "about:blank"
	}
	return c
}

// Validate reports whether c, with its defaults filled, is usable by New:
// ErrNoAgent without an Agent.
func (c Config) Validate() error {
	if c.Agent == nil {
		return ErrNoAgent
	}
	return nil
}

// New returns middleware that decides every request with cfg.Agent before
// passing it to the next handler.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return func(next http.Handler) http.Handler {
		return &handler{cfg: cfg, next: next}
	}, nil
}

type handler struct {
	cfg  Config
	next http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var buf [8]policy.Descriptor
	ds := h.cfg.Extractor.Descriptors(r, buf[:0])
	hits := int64(1)
	if h.cfg.Hits != nil {
		hits = h.cfg.Hits(r)
	}
	d := h.cfg.Agent.Allow(r.Context(), ds, hits)
	SetHeaders(w.Header(), d)
	if d.Allowed {
		h.next.ServeHTTP(w, r)
		return
	}
	status := http.StatusTooManyRequests
	if d.Path == agent.PathFailedClosed {
		status = http.StatusServiceUnavailable
	}
	writeProblem(w, r, status, h.cfg.ProblemType, d)
}

// SetHeaders writes the rate-limit headers describing d: nothing for a
// decision without a rule or by a shadow rule; RateLimit-Policy, RateLimit
// and X-RateLimit-* otherwise; Retry-After for a denial.
func SetHeaders(h http.Header, d agent.Decision) {
	if d.Rule == "" || d.Path == agent.PathShadow {
		return
	}
	name := strconv.Quote(d.Rule) // rule names need no escaping; quote for sf-string
	window := seconds(d.Period)
	reset := seconds(d.Reset)
	remaining := max(d.Remaining, 0)
	h.Set("RateLimit-Policy", fmt.Sprintf("%s;q=%d;w=%d", name, d.Limit, window))
	h.Set("RateLimit", fmt.Sprintf("%s;r=%d;t=%d", name, remaining, reset))
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	if !d.Allowed {
		h.Set("Retry-After", strconv.FormatInt(max(seconds(d.RetryAfter), 1), 10))
	}
}

// seconds rounds d up to whole seconds, as the headers carry them.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// Problem is the application/problem+json body of a rejection (RFC 9457),
// with two extension members.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail"`
	Instance string `json:"instance,omitempty"`
	// Rule is the rule that denied.
	Rule string `json:"rule,omitempty"`
	// RetryAfter is the wait before trying again, in seconds.
	RetryAfter int64 `json:"retry_after"`
}

func writeProblem(w http.ResponseWriter, r *http.Request, status int, typ string, d agent.Decision) {
	p := Problem{
		Type:       typ,
		Title:      http.StatusText(status),
		Status:     status,
		Instance:   r.URL.Path,
		Rule:       d.Rule,
		RetryAfter: max(seconds(d.RetryAfter), 1),
	}
	if status == http.StatusServiceUnavailable {
		p.Detail = fmt.Sprintf("The rate limiter cannot reach its region and rule %q fails closed.", d.Rule)
		if w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", strconv.FormatInt(p.RetryAfter, 10))
		}
	} else {
		p.Detail = fmt.Sprintf("Rate limit %q exceeded: %s.", d.Rule, d.Quota())
	}
	body, _ := json.Marshal(p) // a struct of strings and numbers always encodes
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}
