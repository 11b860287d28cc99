// Package regiond is the regional daemon of ration, in-process: it serves
// the lease API on the region's allocator store, watches policy and serves
// the admin endpoints. cmd/regiond is a thin flag parser around it; tests and
// the local multi-region demo start it in-process.
package regiond

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Daemon. Zero values mean the defaults in the field
// comments; the defaults are the embedded single-machine setup.
type Config struct {
	// Region is this region's name (default "local").
	Region string
	// Listen is the lease API's gRPC address (default "127.0.0.1:7070";
	// port 0 picks a free port, see Daemon.LeaseAddr).
	Listen string
	// Admin is the HTTP address of /healthz, /readyz and /metrics (default
	// "127.0.0.1:7071"; "-" disables it).
	Admin string
	// RedisURL selects the allocator store: empty means the embedded memory
	// store; otherwise redis://, rediss:// or a comma-separated list of
	// Redis Cluster addresses.
	RedisURL string
	// PolicyFile is a YAML policy watched for changes; empty means the
	// embedded example policy.
	PolicyFile string
	// PolicyInterval is how often the policy file is checked (default 1s).
	PolicyInterval time.Duration
	// LeaseTTL is τ, the lifetime of a lease (default 100ms).
	LeaseTTL time.Duration
	// StoreTimeout bounds every store call (default 50ms).
	StoreTimeout time.Duration
	// SweepInterval is how often the memory store drops idle buckets
	// (default 10s).
	SweepInterval time.Duration
	// Registry receives all metrics and is served on /metrics (default a
	// new registry with the Go and process collectors).
	Registry *prometheus.Registry
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) ensureDefaults() {
	if c.Region == "" {
		c.Region = "local"
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:7070"
	}
	if c.Admin == "" {
		c.Admin = "127.0.0.1:7071"
	}
	if c.PolicyInterval == 0 {
		c.PolicyInterval = time.Second
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 100 * time.Millisecond
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = 50 * time.Millisecond
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.PolicyInterval < 0 || c.LeaseTTL < 0 || c.StoreTimeout < 0 || c.SweepInterval < 0 {
		errs = append(errs, errors.New("durations must not be negative"))
	}
	for _, ch := range c.Region {
		if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '_') {
			errs = append(errs, fmt.Errorf("region %q: use lower-case letters, digits, '-' and '_'", c.Region))
			break
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("regiond: invalid config: %w", err)
	}
	return nil
}
