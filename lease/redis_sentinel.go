package lease

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The schemes of a Redis behind Sentinel: the sentinels are listed in the
// host part and the master's name is the path.
const (
	sentinelScheme    = "redis-sentinel://"
	sentinelTLSScheme = "rediss-sentinel://"
)

// isSentinelAddr reports whether addr names a Redis behind Sentinel.
func isSentinelAddr(addr string) bool {
	a := strings.ToLower(strings.TrimSpace(addr))
	return strings.HasPrefix(a, sentinelScheme) || strings.HasPrefix(a, sentinelTLSScheme)
}

// parseRedisSentinel parses
//
//	redis-sentinel://[user:password@]host:port[,host:port…]/MASTER[?option=value&…]
//
// (rediss-sentinel:// for TLS to the data nodes and the sentinels alike)
// into go-redis failover options with NewRedisClient's defaults. The
// user and password are the data nodes'; the options are db (default 0),
// sentinel_username and sentinel_password (the sentinels' own AUTH, if
// they require one), and dial_timeout, read_timeout and write_timeout (a
// positive Go duration or whole seconds). Every sentinel needs an explicit
// port; any other option is an error.
func parseRedisSentinel(addr string) (*redis.FailoverOptions, error) {
	addr = strings.TrimSpace(addr)
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: redis sentinel address %q: %s", ErrInvalid, addr, fmt.Sprintf(format, args...))
	}
	var rest string
	var useTLS bool
	switch lower := strings.ToLower(addr); {
	case strings.HasPrefix(lower, sentinelScheme):
		rest = addr[len(sentinelScheme):]
	case strings.HasPrefix(lower, sentinelTLSScheme):
		rest, useTLS = addr[len(sentinelTLSScheme):], true
	default:
		return nil, bad("want redis-sentinel:// or rediss-sentinel://")
	}
	// The authority holds a list of hosts, which net/url does not parse:
	// cut it out by hand, and let net/url unescape the rest.
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	userinfo, hosts := "", authority
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		userinfo, hosts = authority[:at+1], authority[at+1:]
	}
	u, err := url.Parse("redis://" + userinfo + "sentinels" + tail)
	if err != nil {
		return nil, bad("%v", err)
	}
	if u.Fragment != "" {
		return nil, bad("a fragment (#%s) means nothing here", u.Fragment)
	}

	o := &redis.FailoverOptions{
		DialTimeout:           defaultDialTimeout,
		ReadTimeout:           defaultIOTimeout,
		WriteTimeout:          defaultIOTimeout,
		ContextTimeoutEnabled: true,
	}
	if hosts == "" {
		return nil, bad("no sentinel address")
	}
	for i, h := range strings.Split(hosts, ",") {
		if h == "" {
			return nil, bad("empty element %d in the sentinel list", i)
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			return nil, bad("sentinel %q: want host:port: %v", h, err)
		}
		if host == "" {
			return nil, bad("sentinel %q has no host", h)
		}
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return nil, bad("sentinel %q: bad port %q", h, port)
		}
		o.SentinelAddrs = append(o.SentinelAddrs, net.JoinHostPort(host, port))
	}
	if u.User != nil {
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	master := strings.TrimPrefix(u.Path, "/")
	switch {
	case master == "":
		return nil, bad("no master name (…/MASTER after the sentinels)")
	case strings.Contains(master, "/"):
		return nil, bad("master name %q contains a slash", master)
	case strings.ContainsAny(master, " \t\r\n"):
		return nil, bad("master name %q contains white space", master)
	}
	o.MasterName = master

	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, bad("query: %v", err)
	}
	for name, vals := range q {
		if len(vals) != 1 {
			return nil, bad("option %s given %d times", name, len(vals))
		}
		v := vals[0]
		switch name {
		case "db":
			db, err := strconv.Atoi(v)
			if err != nil || db < 0 {
				return nil, bad("db %q is not a database number", v)
			}
			o.DB = db
		case "sentinel_username":
			o.SentinelUsername = v
		case "sentinel_password":
			o.SentinelPassword = v
		case "dial_timeout", "read_timeout", "write_timeout":
			d, err := positiveDuration(v)
			if err != nil {
				return nil, bad("%s: %v", name, err)
			}
			switch name {
			case "dial_timeout":
				o.DialTimeout = d
			case "read_timeout":
				o.ReadTimeout = d
			default:
				o.WriteTimeout = d
			}
		default:
			return nil, bad("unknown option %q (known: db, sentinel_username, sentinel_password, dial_timeout, read_timeout, write_timeout)", name)
		}
	}
	if useTLS {
		// No ServerName: each connection, to a data node or a sentinel, is
		// verified against the host it dials.
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return o, nil
}

// positiveDuration parses a Go duration ("750ms") or whole seconds ("2"),
// as go-redis's URLs do, and refuses zero and negative values.
func positiveDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		s, ierr := strconv.ParseInt(v, 10, 32)
		if ierr != nil {
			return 0, fmt.Errorf("%q is not a duration", v)
		}
		d = time.Duration(s) * time.Second
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q is not positive", v)
	}
	return d, nil
}
