package lease

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client defaults for NewRedisClient. Every call ration makes carries its
// own deadline (RedisConfig.Timeout on the lease path; the exchange's saves
// of its state up to its hold's end, seconds for a whole save at a million
// keys), and go-redis ends a read at the earlier of the context's deadline
// and the socket timeout: so the I/O timeout only bounds a caller without a
// deadline, and must not cut the exchange's long calls short (at 500ms a
// whole save of 100,000 keys on a loaded machine failed at every epoch).
const (
	defaultDialTimeout = 250 * time.Millisecond
	defaultIOTimeout   = 10 * time.Second
)

// NewRedisClient returns a go-redis client for addr, set up for the lease
// path: context deadlines are honoured (ContextTimeoutEnabled), and dial,
// read and write timeouts default to 250ms, 10s and 10s unless the URL sets
// them (dial_timeout=, read_timeout=, write_timeout=); each call's own
// deadline is what bounds it.
//
// addr is one of:
//   - a redis:// or rediss:// (TLS) URL, or unix:///path/to/socket: one node;
//   - a comma-separated list of cluster nodes, each host:port or a
//     redis:// / rediss:// URL: a Redis Cluster client seeded with all of
//     them (user, password and TLS come from the first URL in the list);
//   - redis-sentinel://[user:password@]host:port[,host:port…]/MASTER[?db=N]
//     (rediss-sentinel:// for TLS): a failover client that asks the
//     sentinels for MASTER's address and follows its promotions, without a
//     restart (see parseRedisSentinel for its options).
//
// The caller owns the client and closes it.
func NewRedisClient(addr string) (redis.UniversalClient, error) {
	return NewRedisClientTLS(addr, nil)
}

// NewRedisClientTLS is NewRedisClient dialling every connection with dial
// (a TLS dialer with its own CA and client certificate, which verifies each
// node by the address it is dialled at), whatever the URL's scheme; nil:
// as the URL says.
func NewRedisClientTLS(addr string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (redis.UniversalClient, error) {
	if isSentinelAddr(addr) {
		failover, err := parseRedisSentinel(addr)
		if err != nil {
			return nil, err
		}
		if dial != nil {
			// go-redis dials the sentinels and the master with this one
			// dialer, so both are verified by the address dialled.
			failover.Dialer, failover.TLSConfig = dial, nil
		}
		return redis.NewFailoverClient(failover), nil
	}
	single, cluster, err := parseRedisAddr(addr)
	if err != nil {
		return nil, err
	}
	if cluster != nil {
		if dial != nil {
			cluster.Dialer, cluster.TLSConfig = dial, nil
		}
		return redis.NewClusterClient(cluster), nil
	}
	if dial != nil {
		single.Dialer, single.TLSConfig = dial, nil
	}
	return redis.NewClient(single), nil
}

// parseRedisAddr is NewRedisClient's parser of single-node and cluster
// addresses (a Sentinel address is parseRedisSentinel's): exactly one of
// the options it returns is non-nil when err is nil.
func parseRedisAddr(addr string) (*redis.Options, *redis.ClusterOptions, error) {
	addr = strings.TrimSpace(addr)
	if addr == "" {
		return nil, nil, fmt.Errorf("%w: empty redis address", ErrInvalid)
	}
	if !strings.Contains(addr, ",") {
		o, err := redis.ParseURL(addr)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: redis address %q: %w", ErrInvalid, addr, err)
		}
		if o.DialTimeout == 0 {
			o.DialTimeout = defaultDialTimeout
		}
		if o.ReadTimeout == 0 {
			o.ReadTimeout = defaultIOTimeout
		}
		if o.WriteTimeout == 0 {
			o.WriteTimeout = defaultIOTimeout
		}
		o.ContextTimeoutEnabled = true
		return o, nil, nil
	}

	c := &redis.ClusterOptions{
		DialTimeout:           defaultDialTimeout,
		ReadTimeout:           defaultIOTimeout,
		WriteTimeout:          defaultIOTimeout,
		ContextTimeoutEnabled: true,
	}
	var first *redis.Options
	for i, part := range strings.Split(addr, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, nil, fmt.Errorf("%w: redis address list %q: empty element %d", ErrInvalid, addr, i)
		}
		if !strings.Contains(part, "://") {
			if _, _, err := net.SplitHostPort(part); err != nil {
				return nil, nil, fmt.Errorf("%w: redis cluster node %q: %w", ErrInvalid, part, err)
			}
			c.Addrs = append(c.Addrs, part)
			continue
		}
		o, err := redis.ParseURL(part)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: redis cluster node %q: %w", ErrInvalid, part, err)
		}
		if o.Network != "tcp" {
			return nil, nil, fmt.Errorf("%w: redis cluster node %q: cluster nodes need TCP addresses", ErrInvalid, part)
		}
		if first == nil {
			first = o
		}
		c.Addrs = append(c.Addrs, o.Addr)
	}
	if first != nil {
		c.Username, c.Password = first.Username, first.Password
		if first.TLSConfig != nil {
			// Each node is verified against its own host name, not the first's.
			c.TLSConfig = first.TLSConfig.Clone()
			c.TLSConfig.ServerName = ""
		}
		if first.DialTimeout != 0 {
			c.DialTimeout = first.DialTimeout
		}
		if first.ReadTimeout != 0 {
			c.ReadTimeout = first.ReadTimeout
		}
		if first.WriteTimeout != 0 {
			c.WriteTimeout = first.WriteTimeout
		}
	}
	return nil, c, nil
}
