package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	leasev1 "github.com/ration-dev/ration/lease/v1"
)

// ErrInvalidConfig is wrapped by New's error when the Config is invalid.
var ErrInvalidConfig = errors.New("agent: invalid config")

// ErrClosed is returned by Wait, WaitPolicy, Shutdown and Close once the
// agent is shut down.
var ErrClosed = errors.New("agent: closed")

// Config configures an Agent (and a Driver). Zero values mean the
// documented default; New fills them on a copy and validates the result.
type Config struct {
	// Target is the region's lease API address, as grpc.NewClient takes it
	// ("regiond.eu.svc:7400", "dns:///..."). Exactly one of Target and Conn
	// must be set.
	Target string
	// RegiondCA, TLSCert, TLSKey and RegiondServerName make the agent dial
	// Target over TLS: RegiondCA is the bundle (a PEM file) that verifies
	// regiond's certificate (default: the system's roots), TLSCert and
	// TLSKey the agent's client certificate and key for a regiond that
	// requires one (mTLS), RegiondServerName the name regiond's certificate
	// must carry (default: Target's host). The files are read again when
	// they change, so that rotated certificates are used without a
	// restart. With none of them set the agent dials in plain text, which
	// it warns about unless Target is a loopback address.
	RegiondCA, TLSCert, TLSKey, RegiondServerName string
	// DialOptions are passed to grpc.NewClient with Target, after the
	// defaults, which they override: the transport above and a reconnect
	// backoff of 20ms growing to 1s, so that the agent notices a region
	// that came back within about a second, not gRPC's default two
	// minutes.
	DialOptions []grpc.DialOption
	// Conn is an existing connection to the lease API, used instead of
	// Target (tests, or a gateway that already holds one). The agent does
	// not close it.
	Conn grpc.ClientConnInterface

	// AgentID names this agent to the region, which counts distinct agents
	// to size everyone's emergency bucket. Default host:pid:random. At most
	// 256 bytes.
	AgentID string

	// LeasePeriod is T_lease: a lease is sized to cover this much of the
	// key's recent spend. Default DefaultLeasePeriod (50ms).
	LeasePeriod time.Duration
	// LeaseTTL is τ, how long a lease may be spent from when its request was
	// sent, used when the region's grant carries no ttl. Default
	// leasev1.DefaultLeaseTTL (100ms).
	LeaseTTL time.Duration
	// RoundTripTimeout bounds the synchronous round trip of a request whose
	// key holds no tokens (a cold key); when it passes, the rule's failure
	// mode decides. Default 5ms: agents and regiond share a region, where a
	// round trip takes well under a millisecond, and a request should not
	// wait much longer than that.
	RoundTripTimeout time.Duration
	// RefreshTimeout bounds a background refresh or return call. Default
	// LeasePeriod: a refresh slower than a lease period is useless.
	RefreshTimeout time.Duration
	// IdleAfter is how long a key may see no request before it is evicted
	// from memory. Its unused tokens go back to the region earlier, as soon
	// as a whole lease period passes without a spend. Default 10s.
	IdleAfter time.Duration
	// FallbackHeadroom multiplies an agent's fair share of the regional
	// rate (rate ÷ agents) to give the emergency bucket's rate. Default
	// DefaultFallbackHeadroom.
	FallbackHeadroom float64
	// BreakerFailures is how many round trips in a row must fail before the
	// agent stops trying the region and decides by failure mode at once.
	// Default 3.
	BreakerFailures int
	// ProbeInterval is how often an open breaker lets one call through to
	// see whether the region is back. Default 2 × LeasePeriod.
	ProbeInterval time.Duration
	// CloseTimeout bounds Close: stopping the agent and returning its unused
	// tokens. Default 500ms.
	CloseTimeout time.Duration

	// Registerer receives the agent's metrics (ration_agent_...); nil
	// registers none.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock is read once per decision and dates leases and the deny cache;
	// it also places a fixed window's decisions in their window. Default:
	// the monotonic clock, read with time.Since of the agent's start (half
	// the cost of time.Now), with the wall clock read on every refresher
	// tick for the windows. Timers (refresh ticks, backoff) use real time.
	Clock func() time.Time
}

// DefaultFallbackHeadroom is Config.FallbackHeadroom's default: while the
// region is unreachable, an agent's emergency bucket runs at twice its fair
// share of the regional rate, so that uneven load across agents is not
// denied, at a bounded excess (the simulator's bound counts it).
const DefaultFallbackHeadroom = 2

// DefaultLeasePeriod is Config.LeasePeriod's default, T_lease: a lease
// covers this much of its key's recent spend.
const DefaultLeasePeriod = 50 * time.Millisecond

// withDefaults returns a copy of c with every zero optional field set to its
// default. A missing AgentID becomes host:pid:random.
func (c Config) withDefaults() Config {
	if c.AgentID == "" {
		host, _ := os.Hostname()
		var b [4]byte
		rand.Read(b[:]) // never fails (Go 1.24+)
		c.AgentID = host + ":" + strconv.Itoa(os.Getpid()) + ":" + hex.EncodeToString(b[:])
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.LeasePeriod, DefaultLeasePeriod)
	def(&c.LeaseTTL, leasev1.DefaultLeaseTTL)
	def(&c.RoundTripTimeout, 5*time.Millisecond)
	def(&c.RefreshTimeout, c.LeasePeriod)
	def(&c.IdleAfter, 10*time.Second)
	def(&c.ProbeInterval, 2*c.LeasePeriod)
	def(&c.CloseTimeout, 500*time.Millisecond)
	if c.FallbackHeadroom == 0 {
		c.FallbackHeadroom = DefaultFallbackHeadroom
	}
	if c.BreakerFailures == 0 {
		c.BreakerFailures = 3
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	return c
}

// Validate reports whether c, with its defaults filled, is usable by New.
// The error wraps ErrInvalidConfig.
func (c Config) Validate() error { return c.withDefaults().validate() }

// validate is Validate of a config whose defaults are filled.
func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case (c.Target == "") == (c.Conn == nil):
		return bad("exactly one of Target and Conn must be set")
	case len(c.AgentID) > 256:
		return bad("AgentID is %d bytes, more than 256", len(c.AgentID))
	case c.LeasePeriod <= 0, c.LeaseTTL <= 0, c.RoundTripTimeout <= 0, c.RefreshTimeout <= 0,
		c.IdleAfter <= 0, c.ProbeInterval <= 0, c.CloseTimeout <= 0:
		return bad("durations must be positive")
	case c.LeaseTTL < c.LeasePeriod:
		return bad("LeaseTTL %v is shorter than LeasePeriod %v: every lease would expire before it is used", c.LeaseTTL, c.LeasePeriod)
	case c.IdleAfter < c.LeaseTTL:
		return bad("IdleAfter %v is shorter than LeaseTTL %v", c.IdleAfter, c.LeaseTTL)
	case !(c.FallbackHeadroom > 0) || math.IsInf(c.FallbackHeadroom, 0):
		return bad("FallbackHeadroom %v must be a positive finite number", c.FallbackHeadroom)
	case c.BreakerFailures < 1:
		return bad("BreakerFailures %d must be at least 1", c.BreakerFailures)
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return bad("TLSCert and TLSKey go together")
	case c.Conn != nil && c.tls():
		return bad("TLS files are for dialling Target; Conn is already connected")
	}
	return nil
}

// tls reports whether the agent dials Target over TLS.
func (c Config) tls() bool {
	return c.RegiondCA != "" || c.TLSCert != "" || c.TLSKey != "" || c.RegiondServerName != ""
}
