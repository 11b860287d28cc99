// Package regiond is the regional daemon of ration, in-process: it serves
// the lease API on the region's allocator store, watches policy and serves
// the admin endpoints. cmd/regiond is a thin flag parser around it; tests and
// the local multi-region demo start it in-process.
package regiond

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/rlqs"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy/kvstore"
	"github.com/ration-dev/ration/region"
)

// Config configures a Daemon. Zero values mean the defaults in the field
// comments; the defaults are the embedded single-machine setup.
type Config struct {
	// Region is this region's name (default "local").
	Region string
	// Listen is the lease API's gRPC address (default "127.0.0.1:7070";
	// port 0 picks a free port, see Daemon.LeaseAddr).
	Listen string
	// TLSCert and TLSKey are the lease API's server certificate chain and
	// key (PEM files, read again when they change, so that a rotation on
	// disk needs no restart); TLSClientCA, when set, makes the lease API
	// require client certificates that bundle verifies (mTLS). Without
	// TLSCert the lease API is plaintext, which is refused on an address
	// that is not loopback unless Insecure.
	TLSCert, TLSKey, TLSClientCA string
	// RLQSListen, when set, serves Envoy's Rate Limit Quota Service
	// (lease/rlqs) on this gRPC address, with the lease API's TLS (TLSCert,
	// TLSKey, TLSClientCA) and the same plaintext rule; port 0 picks a free
	// port (Daemon.RLQSAddr). Empty: no RLQS.
	RLQSListen string
	// RLQS, if set, adjusts the RLQS server's configuration (its Leaser,
	// Registerer and Logger are the daemon's).
	RLQS func(*rlqs.Config)
	// Insecure allows a plaintext lease API on a non-loopback address (a
	// private network the deployment trusts, or a service mesh's own mTLS).
	Insecure bool
	// AdminTokenFile, when set, names a file holding a bearer token (at
	// least 16 bytes; read again when it changes) that /metrics, /policy
	// and the admin API (/v1/…) require (Authorization: Bearer …);
	// /healthz and /readyz stay open for probes.
	AdminTokenFile string
	// Admin is the HTTP address of /healthz, /readyz and /metrics (default
	// "127.0.0.1:7071"; "-" disables it).
	Admin string
	// RedisURL selects the allocator store: empty means the embedded memory
	// store; otherwise redis://, rediss://, a comma-separated list of
	// Redis Cluster addresses, or a Redis under Sentinel:
	// redis-sentinel://[user:password@]host:port[,host:port…]/MASTER?db=N
	// (rediss-sentinel:// over TLS; options sentinel_username,
	// sentinel_password, dial_timeout, read_timeout, write_timeout), which
	// follows the master's promotions without a restart.
	RedisURL string
	// RedisCA, RedisCert and RedisKey connect to Redis over TLS (whatever
	// RedisURL's scheme): RedisCA verifies the server (default: the
	// system's roots), RedisCert and RedisKey are a client certificate for
	// a Redis with tls-auth-clients. PEM files, read again when they change.
	// A Redis ACL user and password go in RedisURL
	// (rediss://user:password@host:port/0).
	RedisCA, RedisCert, RedisKey string
	// RedisLayout and RedisGroups place each key's state in Redis: its own
	// Redis key (lease.LayoutKeys, the default) or a field of one of
	// RedisGroups hashes (lease.LayoutGroups, about half the memory a key;
	// lease.RedisConfig says how to size it and switch).
	RedisLayout lease.RedisLayout
	RedisGroups int
	// PolicyFile is a YAML policy watched for changes, or
	// "nats-kv://BUCKET": the policy store on the NATS of NATSURL or
	// NATSEmbedded (a JetStream key-value bucket that `ration policy push`
	// writes; every region watching one bucket enforces one policy). Empty
	// means the embedded example policy.
	PolicyFile string
	// PolicyReplicas is the replicas of the policy store's bucket when
	// regiond creates it (default 1; 3 on a three-server cluster).
	PolicyReplicas int
	// NATSStoreDir is where the embedded NATS server keeps JetStream's
	// data, the policy store's included (default: a temporary directory,
	// removed at shutdown).
	NATSStoreDir string
	// PolicyInterval is how often the policy file is checked (default 1s).
	PolicyInterval time.Duration
	// PolicyYAML is the policy served when PolicyFile is empty, for
	// in-process deployments such as the local demo (default: the embedded
	// example policy). It is validated like a file.
	PolicyYAML []byte
	// LeaseTTL is τ, the lifetime of a lease (default 100ms).
	LeaseTTL time.Duration
	// StoreTimeout bounds every store call (default 50ms).
	StoreTimeout time.Duration
	// SweepInterval is how often the memory store drops idle buckets
	// (default 10s).
	SweepInterval time.Duration
	// NATSURL is the NATS server (or a comma-separated list of a cluster's
	// servers) that carries the cross-region exchange. With neither it nor
	// NATSEmbedded set there is no exchange: the region holds the whole of
	// every global key (share 1), as a single-region deployment should.
	NATSURL string
	// NATSCA, NATSCert and NATSKey connect to NATS over TLS: NATSCA
	// verifies the servers (default: the system's roots; read at start),
	// NATSCert and NATSKey are a client certificate (read again when they
	// change). PEM files.
	NATSCA, NATSCert, NATSKey string
	// NATSCreds is a .creds file (a user JWT and its nkey seed) for a NATS
	// in operator mode; NATSNkey a file holding an nkey user's seed. At
	// most one of them, and neither with a user and password in NATSURL.
	NATSCreds, NATSNkey string
	// NATSEmbedded runs nats-server in-process on NATSListen and exchanges
	// over it; other regions' daemons connect to it (Daemon.NATSURL).
	// Exclusive with NATSURL.
	NATSEmbedded bool
	// NATSListen is the embedded NATS server's client address (default
	// "127.0.0.1:4222"; port 0 picks a free port).
	NATSListen string
	// NATSReconnectWait is how long the NATS client waits between
	// reconnection attempts; it retries forever (default 250ms).
	NATSReconnectWait time.Duration
	// Regions are all regions of the deployment, Region included, in any
	// order (default: Region alone). Every region must list the same ones;
	// each starts with an equal part of every global key.
	Regions []string
	// SyncPeriod is the exchange's epoch: reports are published and shares
	// moved once per period (default 1s; every region must use the same).
	SyncPeriod time.Duration
	// DecideAfter is how long after the start of an epoch (when tallies
	// are published) the region decides its moves: more than the one-way
	// delay between regions plus clock skew. Default SyncPeriod/4; below
	// SyncPeriod/2.
	DecideAfter time.Duration
	// ReportRefresh is how often, in sync periods, the exchange's reports
	// (deltas) list a key that did not change (region.Config.Refresh):
	// default 600; -1 sends full reports, for a rolling upgrade from a
	// release before deltas.
	ReportRefresh int
	// IdleAfter is how long a global key must see no demand in any region
	// before the exchange retires it (region.Config.IdleAfter): default
	// 60s. Keys asked less often than that re-enter the exchange at each
	// request; the same in every region.
	IdleAfter time.Duration
	// Replica names this replica within its region (default
	// "<hostname>-<random>"). Replicas of one region share its store; one
	// at a time runs the exchange.
	Replica string
	// ReadyGrace is how long after Start /readyz waits for a report from
	// every other region before it says ready without them, so that one
	// region that is down does not take the others out of service
	// (default 10 sync periods; only with an exchange).
	ReadyGrace time.Duration
	// ExchangeTune, if set, adjusts the exchange's region.Config (for tests
	// that shorten idle and grace periods).
	ExchangeTune func(*region.Config)
	// Registry receives all metrics and is served on /metrics (default a
	// new registry with the Go and process collectors).
	Registry *prometheus.Registry
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// ErrInvalidConfig is wrapped by New's and Validate's errors for a Config
// that cannot be used.
var ErrInvalidConfig = errors.New("regiond: invalid config")

// withDefaults returns c with every zero optional field set to its default
// (the Regions slice copied and sorted).
func (c Config) withDefaults() Config {
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
		c.LeaseTTL = service.DefaultLeaseTTL
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = service.DefaultStoreTimeout
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = 10 * time.Second
	}
	if c.NATSListen == "" {
		c.NATSListen = "127.0.0.1:4222"
	}
	if c.NATSReconnectWait == 0 {
		c.NATSReconnectWait = 250 * time.Millisecond
	}
	if c.SyncPeriod == 0 {
		c.SyncPeriod = time.Second
	}
	if c.DecideAfter == 0 {
		c.DecideAfter = c.SyncPeriod / 4
	}
	if c.ReadyGrace == 0 {
		c.ReadyGrace = 10 * c.SyncPeriod
	}
	if len(c.Regions) == 0 {
		c.Regions = []string{c.Region}
	}
	c.Regions = slices.Clone(c.Regions)
	slices.Sort(c.Regions)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports whether c, with its defaults filled, is usable by New.
// The error wraps ErrInvalidConfig and lists every problem.
func (c Config) Validate() error { return c.withDefaults().validate() }

func (c Config) validate() error {
	var errs []error
	if c.PolicyInterval < 0 || c.LeaseTTL < 0 || c.StoreTimeout < 0 || c.SweepInterval < 0 || c.NATSReconnectWait < 0 || c.ReadyGrace < 0 || c.IdleAfter < 0 {
		errs = append(errs, errors.New("durations must not be negative"))
	}
	if c.SyncPeriod < time.Millisecond {
		errs = append(errs, fmt.Errorf("sync period %v is below 1ms", c.SyncPeriod))
	}
	if c.DecideAfter < 0 || 2*c.DecideAfter >= c.SyncPeriod {
		errs = append(errs, fmt.Errorf("decide-after %v is not in [0, sync period/2)", c.DecideAfter))
	}
	if (c.RedisLayout != lease.LayoutKeys || c.RedisGroups != 0) && c.RedisURL == "" {
		errs = append(errs, errors.New("a Redis layout (-redis-layout, -redis-groups) without a Redis (-redis)"))
	}
	if (c.RedisCA != "" || c.RedisCert != "" || c.RedisKey != "") && c.RedisURL == "" {
		errs = append(errs, errors.New("redis TLS files (-redis-ca, -redis-cert, -redis-key) without a Redis (-redis)"))
	}
	if (c.RedisCert == "") != (c.RedisKey == "") {
		errs = append(errs, errors.New("redis TLS: give the client certificate and its key (-redis-cert, -redis-key), or neither"))
	}
	if err := c.checkTLS(); err != nil {
		errs = append(errs, err)
	}
	if c.NATSCreds != "" && c.NATSNkey != "" {
		errs = append(errs, errors.New("NATS: give a .creds file (-nats-creds) or an nkey seed (-nats-nkey), not both"))
	}
	if (c.NATSCert == "") != (c.NATSKey == "") {
		errs = append(errs, errors.New("NATS TLS: give the client certificate and its key (-nats-cert, -nats-key), or neither"))
	}
	if c.policyBucket() != "" && !c.exchanging() {
		errs = append(errs, fmt.Errorf("policy %s: the policy store is on NATS: give -nats or -nats-embedded", c.PolicyFile))
	}
	if strings.HasPrefix(c.PolicyFile, kvScheme) && !kvstore.ValidBucket(c.policyBucket()) {
		errs = append(errs, fmt.Errorf("policy %s: a bucket name of letters, digits, '-' and '_'", c.PolicyFile))
	}
	if c.PolicyReplicas < 0 || c.PolicyReplicas > kvstore.MaxReplicas {
		errs = append(errs, fmt.Errorf("policy replicas %d: 1 to %d", c.PolicyReplicas, kvstore.MaxReplicas))
	}
	if c.NATSURL != "" && c.NATSEmbedded {
		errs = append(errs, errors.New("NATS: use an external server (NATSURL) or the embedded one, not both"))
	}
	for _, r := range append([]string{c.Region}, c.Regions...) {
		if !validRegion(r) {
			errs = append(errs, fmt.Errorf("region %q: use lower-case letters, digits, '-' and '_'", r))
			break
		}
	}
	if !slices.Contains(c.Regions, c.Region) {
		errs = append(errs, fmt.Errorf("regions %v do not include this region %q", c.Regions, c.Region))
	}
	if len(slices.Compact(slices.Clone(c.Regions))) != len(c.Regions) {
		errs = append(errs, fmt.Errorf("regions %v: a region is listed twice", c.Regions))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// checkTLS checks the lease API's TLS files and refuses plaintext on an
// address other than loopback without Insecure.
func (c Config) checkTLS() error {
	switch {
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("TLS: give the lease API's certificate and its key (-tls-cert, -tls-key), or neither")
	case c.TLSClientCA != "" && c.TLSCert == "":
		return errors.New("TLS: a client CA (-tls-client-ca) needs the server's own certificate (-tls-cert, -tls-key)")
	case c.RLQSListen != "" && c.TLSCert == "" && !c.Insecure && !tlsfiles.Loopback(c.RLQSListen):
		return fmt.Errorf("TLS: RLQS would listen in plaintext on %s, which is not a loopback address: give -tls-cert and -tls-key, or -insecure to allow plaintext", c.RLQSListen)
	case c.TLSCert == "" && !c.Insecure && !tlsfiles.Loopback(c.Listen):
		return fmt.Errorf("TLS: the lease API would listen in plaintext on %s, which is not a loopback address: give -tls-cert and -tls-key (and -tls-client-ca to require client certificates), or -insecure to allow plaintext", c.Listen)
	}
	return nil
}

func validRegion(r string) bool {
	if r == "" {
		return false
	}
	for _, ch := range r {
		if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '_') {
			return false
		}
	}
	return true
}

// kvScheme prefixes a PolicyFile that names the policy store's bucket.
const kvScheme = "nats-kv://"

// policyBucket is the policy store's bucket, "" for a file policy.
func (c Config) policyBucket() string {
	b, ok := strings.CutPrefix(c.PolicyFile, kvScheme)
	if !ok {
		return ""
	}
	return strings.TrimSuffix(b, "/")
}

// exchanging reports whether the cross-region exchange runs.
func (c Config) exchanging() bool { return c.NATSURL != "" || c.NATSEmbedded }
