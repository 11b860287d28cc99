// Package embedded runs the real nats-server in-process, as a library: the
// embedded default of a one-machine deployment (regiond -nats-embedded, the
// local three-region demo) and of tests. Production points regiond at an
// external NATS server, cluster or supercluster instead; nothing else
// changes.
//
// Start runs one server. StartCluster runs several joined by routes, and
// StartSupercluster several clusters joined by gateways, all on loopback
// with free ports, so that tests can show the exchange working over the
// same topologies a deployment uses (a cluster per region, gateways
// between regions). Config.Users turns on authentication with per-user
// subject permissions; RegionUser builds the user that confines one
// region's exchange to publishing its own reports. Config.JetStream turns
// on JetStream, which the policy store (policy/kvstore) keeps its bucket
// in; PolicyReader and PolicyWriter are the subjects its users need.
package embedded

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// ErrInvalidConfig reports a Config, ClusterConfig or SuperclusterConfig
// that cannot be used; nothing was started.
var ErrInvalidConfig = errors.New("embedded nats: invalid config")

// ErrNotReady reports a server that did not accept connections, or routes
// or gateways that did not all connect, within the configured timeout.
// Everything that was started has been shut down again.
var ErrNotReady = errors.New("embedded nats: not ready")

// Config configures a Server. The zero value listens on a random loopback
// port and accepts every client.
type Config struct {
	// Listen is the client address, host:port (default "127.0.0.1:0";
	// port 0 picks a free port, see Server.ClientURL). In a cluster the
	// port must be 0 and the host is also where routes and gateways listen.
	Listen string
	// MaxPayload is the largest message the server accepts, in bytes
	// (default 0: the server's default of 1 MiB).
	MaxPayload int32
	// ReadyTimeout bounds how long Start waits for the server to accept
	// connections (default 10s).
	ReadyTimeout time.Duration
	// Users, if any, are the only clients the server accepts (nats.UserInfo
	// on the client), each limited to its permissions; all of them share
	// one account, so what one publishes the others can receive. Default
	// none: every client is accepted with every permission.
	Users []User
	// Operator, if set, runs the server in operator mode (decentralized JWT
	// authentication, as nsc sets a deployment up): it trusts this
	// operator and knows these accounts, so that clients connect with a
	// .creds file of a user of one of them. Exclusive with Users.
	Operator *Operator
	// TLS, if set, makes the server require TLS of its clients with this
	// configuration (a certificate, and, to require client certificates,
	// ClientAuth and how to verify them: tlsfiles.Server gives one).
	TLS *tls.Config
	// JetStream turns on JetStream (streams, key-value buckets) for the
	// server's account (default off). With Users, the users share that
	// account's JetStream; what each may do with it is its permissions'
	// concern (PolicyReader, PolicyWriter). Start only: StartCluster and
	// StartSupercluster run their servers without JetStream. With
	// Operator, the accounts' JWTs must grant JetStream limits.
	JetStream bool
	// StoreDir is where JetStream keeps its files. Default "": a fresh
	// temporary directory that Server.Close removes. A given directory is
	// kept, so that a server started again on it finds its streams.
	StoreDir string
}

// Operator is an operator's JWT and the JWTs of the accounts it signed.
type Operator struct {
	JWT      string
	Accounts []string
}

// User is a client identity with the subjects it may use.
type User struct {
	// Name is the user name. Required, unique within a Config.
	Name string
	// Password is the user's password; Nkey instead is the public key of
	// an nkey user (a "U..." key), who proves it holds the seed. One of
	// them is required.
	Password string
	Nkey     string
	// Publish lists the subjects the user may publish to; NATS wildcards
	// ('*' a token, '>' the rest) are allowed. nil allows every subject; an
	// empty, non-nil list allows none. The server rejects a publish outside
	// the list with a permissions violation (nats.ErrPermissionViolation,
	// reported to the client's error handler) and delivers it to no one.
	Publish []string
	// Subscribe lists the subjects the user may subscribe to, as Publish.
	Subscribe []string
}

// RegionUser returns the user that a region's exchange connects as: named
// after the region, it may publish only on "<subject>.<region>" (its own
// reports) and subscribe to "<subject>.>" (every region's reports), so the
// credentials of one region cannot forge another region's reports. subject
// is the exchange's Config.Subject ("ration.sync" by default).
func RegionUser(subject, region, password string) User {
	return User{
		Name:      region,
		Password:  password,
		Publish:   []string{subject + "." + region},
		Subscribe: []string{subject + ".>"},
	}
}

// Permissions are subjects to add to a User's (User.Allow).
type Permissions struct {
	Publish   []string
	Subscribe []string
}

// Allow returns u with p's subjects added to its lists. A nil list of u
// (every subject allowed) stays nil.
func (u User) Allow(p Permissions) User {
	add := func(have, more []string) []string {
		if have == nil {
			return nil
		}
		out := slices.Clone(have)
		for _, s := range more {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
		return out
	}
	u.Publish = add(u.Publish, p.Publish)
	u.Subscribe = add(u.Subscribe, p.Subscribe)
	return u
}

// PolicyReader returns the subjects a client needs to read and watch the
// JetStream key-value bucket of the policy store (policy/kvstore) without
// creating it: the stream's info, direct gets of a key's latest value or of
// a revision, the ordered consumer a watch or a history creates, deletes
// and answers flow control for, and replies on _INBOX.>. A reader cannot
// write: a put or a delete is a publish on $KV.<bucket>.<key>, which it
// lacks. regiond's region user takes it with
// RegionUser(...).Allow(PolicyReader(bucket)).
//
// _INBOX.> lets the user receive replies addressed to other clients' inboxes
// of the account; a user that must not connects with
// nats.CustomInboxPrefix and is given that prefix instead.
func PolicyReader(bucket string) Permissions {
	stream := "KV_" + bucket
	return Permissions{
		Publish: []string{
			"$JS.API.STREAM.INFO." + stream,
			"$JS.API.DIRECT.GET." + stream,
			"$JS.API.DIRECT.GET." + stream + ".>",
			"$JS.API.STREAM.MSG.GET." + stream,
			"$JS.API.CONSUMER.CREATE." + stream,
			"$JS.API.CONSUMER.CREATE." + stream + ".>",
			"$JS.API.CONSUMER.INFO." + stream + ".*",
			"$JS.API.CONSUMER.DELETE." + stream + ".*",
			"$JS.FC." + stream + ".>",
		},
		Subscribe: []string{"_INBOX.>"},
	}
}

// PolicyWriter returns the subjects of the policy store's writer (ration
// policy push, rollback, promote, unstage): PolicyReader's, plus
// $KV.<bucket>.> (puts and delete markers), the account's JetStream info
// and the creation of the bucket's stream (the first push creates the
// bucket), and $SYS.REQ.USER.INFO, which the CLI asks who it is connected
// as so that the revision records a verified author.
func PolicyWriter(bucket string) Permissions {
	p := PolicyReader(bucket)
	p.Publish = append(p.Publish,
		"$KV."+bucket+".>",
		"$JS.API.INFO",
		"$JS.API.STREAM.CREATE.KV_"+bucket,
		"$SYS.REQ.USER.INFO",
	)
	return p
}

// Server is a running in-process nats-server.
type Server struct {
	ns *server.Server
	// tmpDir is the JetStream directory Start created, removed by Close.
	tmpDir string
}

// Start starts a server and waits until it accepts connections. The error
// wraps ErrInvalidConfig or ErrNotReady.
func Start(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	host, port, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	opts := cfg.options(host, port)
	if cfg.Operator != nil {
		if err := cfg.operatorOptions(opts); err != nil {
			return nil, err
		}
	}
	if !cfg.JetStream {
		return startServer(opts, cfg.ReadyTimeout)
	}
	opts.JetStream, opts.StoreDir = true, cfg.StoreDir
	tmp := ""
	if cfg.StoreDir == "" {
		tmp, err = os.MkdirTemp("", "ration-nats-js-")
		if err != nil {
			return nil, fmt.Errorf("embedded nats: JetStream directory: %w", err)
		}
		opts.StoreDir = tmp
	}
	s, err := startServer(opts, cfg.ReadyTimeout)
	if err != nil {
		if tmp != "" {
			_ = os.RemoveAll(tmp)
		}
		return nil, err
	}
	s.tmpDir = tmp
	return s, nil
}

// startServer starts one server with opts and waits until it accepts
// connections (and its route and gateway listeners are up).
func startServer(opts *server.Options, ready time.Duration) (*Server, error) {
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	ns.Start()
	if !ns.ReadyForConnections(ready) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("%w: server not accepting connections within %v", ErrNotReady, ready)
	}
	return &Server{ns: ns}, nil
}

// ClientURL is the nats:// URL clients connect to.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// Name is the server's name: in a cluster "<cluster>-<index>", alone the
// server's generated ID.
func (s *Server) Name() string { return s.ns.Name() }

// Close stops the server, closes its clients' connections and waits until
// every goroutine of the server has stopped, then removes the JetStream
// directory Start created (not a Config.StoreDir). Calling it again does
// nothing. The error is the removal's.
func (s *Server) Close() error {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	if s.tmpDir == "" {
		return nil
	}
	if err := os.RemoveAll(s.tmpDir); err != nil {
		return fmt.Errorf("embedded nats: removing the JetStream directory: %w", err)
	}
	return nil
}

// StoreDir is the directory JetStream keeps its files in ("" without
// JetStream).
func (s *Server) StoreDir() string { return s.ns.StoreDir() }

// Running reports whether the server has not been shut down.
func (s *Server) Running() bool { return s.ns.Running() }

func (c Config) withDefaults() Config {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 10 * time.Second
	}
	return c
}

// Validate reports whether c, with its defaults filled, is usable by Start.
// The error wraps ErrInvalidConfig.
func (c Config) Validate() error {
	_, _, err := c.withDefaults().validate()
	return err
}

// validate checks a Config with its defaults filled and returns the listen
// host and port.
func (c Config) validate() (string, int, error) {
	bad := func(format string, args ...any) (string, int, error) {
		return "", 0, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	host, portStr, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return bad("listen address %q: %v", c.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return bad("listen port %q is not a port number", portStr)
	}
	switch {
	case c.MaxPayload < 0:
		return bad("MaxPayload %d is negative", c.MaxPayload)
	case c.ReadyTimeout < 0:
		return bad("ReadyTimeout %v is negative", c.ReadyTimeout)
	}
	if c.Operator != nil && len(c.Users) > 0 {
		return bad("Operator and Users are exclusive: in operator mode the accounts' JWTs hold the users")
	}
	names := make(map[string]bool, len(c.Users))
	for i, u := range c.Users {
		switch {
		case u.Name == "" || strings.ContainsAny(u.Name, " \t\r\n"):
			return bad("user %d: name %q is empty or has white space", i, u.Name)
		case names[u.Name]:
			return bad("user %q listed twice", u.Name)
		case (u.Password == "") == (u.Nkey == ""):
			return bad("user %q needs a password or an nkey, not both", u.Name)
		case u.Nkey != "" && !nkeys.IsValidPublicUserKey(u.Nkey):
			return bad("user %q: nkey %q is not a user's public key", u.Name, u.Nkey)
		}
		names[u.Name] = true
		for _, s := range slices.Concat(u.Publish, u.Subscribe) {
			if !server.IsValidSubject(s) {
				return bad("user %q: %q is not a NATS subject", u.Name, s)
			}
		}
	}
	return host, port, nil
}

// operatorOptions sets opts to trust c.Operator and resolve its accounts
// from memory.
func (c Config) operatorOptions(opts *server.Options) error {
	op, err := jwt.DecodeOperatorClaims(c.Operator.JWT)
	if err != nil {
		return fmt.Errorf("%w: operator JWT: %w", ErrInvalidConfig, err)
	}
	res := &server.MemAccResolver{}
	for i, a := range c.Operator.Accounts {
		ac, err := jwt.DecodeAccountClaims(a)
		if err != nil {
			return fmt.Errorf("%w: account JWT %d: %w", ErrInvalidConfig, i, err)
		}
		if err := res.Store(ac.Subject, a); err != nil {
			return fmt.Errorf("%w: account JWT %d: %w", ErrInvalidConfig, i, err)
		}
	}
	opts.TrustedOperators, opts.AccountResolver = []*jwt.OperatorClaims{op}, res
	return nil
}

// options builds the server options of a validated Config; port 0 becomes
// a random port.
func (c Config) options(host string, port int) *server.Options {
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		Host:       host,
		Port:       port,
		MaxPayload: c.MaxPayload,
		NoLog:      true,
		NoSigs:     true,
	}
	if c.TLS != nil {
		opts.TLS, opts.TLSConfig, opts.TLSTimeout = true, c.TLS, 2
	}
	for _, u := range c.Users {
		perms := &server.Permissions{Publish: allow(u.Publish), Subscribe: allow(u.Subscribe)}
		if u.Nkey != "" {
			opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: u.Nkey, Permissions: perms})
			continue
		}
		opts.Users = append(opts.Users, &server.User{Username: u.Name, Password: u.Password, Permissions: perms})
	}
	return opts
}

// allow turns an allow list into the server's form, keeping nil (no
// restriction) apart from empty (nothing allowed).
func allow(subjects []string) *server.SubjectPermission {
	if subjects == nil {
		return nil
	}
	return &server.SubjectPermission{Allow: append([]string{}, subjects...)}
}

// listenURL is the URL of a listener at addr, for routes and gateways.
func listenURL(scheme string, addr *net.TCPAddr) *url.URL {
	return &url.URL{Scheme: scheme, Host: addr.String()}
}
