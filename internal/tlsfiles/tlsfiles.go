// Package tlsfiles builds TLS configurations from PEM files and re-reads the
// files when they change, so that certificates rotated on disk (by
// cert-manager, a SPIFFE helper, or by hand) are used at the next handshake
// without a restart.
package tlsfiles

import (
	"context"
	"net"
	"strings"

	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// ErrConfig is wrapped by the errors of Server and Client for files that
// cannot be used.
var ErrConfig = errors.New("tlsfiles: invalid TLS files")

// Files names the PEM files of one end of a connection.
type Files struct {
	// Cert and Key are this end's certificate chain and private key: both
	// or neither.
	Cert, Key string
	// CA is the bundle that verifies the other end: a server with one
	// requires and verifies client certificates; a client without one
	// verifies the server with the system's roots.
	CA string
	// ServerName is, for a client, the name the server's certificate must
	// carry (default: the host dialled).
	ServerName string
	// Logger reports a reload that failed (the files in use stay); default
	// slog.Default().
	Logger *slog.Logger
}

// Set reports whether any file is named.
func (f Files) Set() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// checkEvery is how often a handshake looks at the files' modification
// times: a rotation takes effect within it. (Tests set it to 0.)
var checkEvery = time.Second

// Server returns the configuration of a TLS server presenting Cert and Key,
// and, with CA, requiring client certificates it verifies. (Both are read
// at each handshake, so the verification is done here rather than by
// crypto/tls, whose ClientCAs cannot change: a client's chain is checked
// against the current bundle exactly as crypto/tls would, and the leaf is
// PeerCertificates[0].)
func Server(f Files) (*tls.Config, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, fmt.Errorf("%w: a server needs a certificate and a key", ErrConfig)
	}
	w, err := newWatcher(f)
	if err != nil {
		return nil, err
	}
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return w.current().cert, nil
		},
	}
	if f.CA != "" {
		c.ClientAuth = tls.RequireAnyClientCert
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			return verify(cs, w.current().pool, "", x509.ExtKeyUsageClientAuth)
		}
	}
	return c, nil
}

// ClientTLS is the client side of TLS files: per connection, a
// configuration that verifies the server by the name it is dialled by
// (For), which gRPC and Redis connections get from Credentials and Dial.
type ClientTLS struct {
	f Files
	w *watcher
}

// Client reads the client side's files: the server is verified against CA
// (the system's roots without one) and, with Cert and Key, a client
// certificate is presented.
func Client(f Files) (*ClientTLS, error) {
	if (f.Cert == "") != (f.Key == "") {
		return nil, fmt.Errorf("%w: a client certificate needs its key, and a key its certificate", ErrConfig)
	}
	w, err := newWatcher(f)
	if err != nil {
		return nil, err
	}
	return &ClientTLS{f: f, w: w}, nil
}

// For returns the configuration of one connection to host (a DNS name or
// an IP address): the server's certificate must be valid for Files'
// ServerName, or else for host. (crypto/tls sends no server name for an IP
// address, so the name is fixed here rather than read back from the
// handshake.)
func (c *ClientTLS) For(host string) *tls.Config {
	name := c.f.ServerName
	if name == "" {
		name = host
	}
	cfg := c.base(name)
	if c.f.CA != "" {
		// The roots may be rotated too, which tls.Config.RootCAs cannot
		// follow: the chain is verified here, against the current bundle,
		// exactly as crypto/tls would.
		w := c.w
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if name == "" {
				return errors.New("tlsfiles: no server name to verify the server's certificate against")
			}
			return verify(cs, w.current().pool, name, x509.ExtKeyUsageServerAuth)
		}
	}
	return cfg
}

// base is a client configuration for server name: TLS 1.2 at least, and
// the client certificate as read at each handshake.
func (c *ClientTLS) base(name string) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
	if c.f.Cert != "" {
		w := c.w
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return w.current().cert, nil
		}
	}
	return cfg
}

// Static returns a configuration for clients that set the server's name
// themselves and verify the server with crypto/tls (NATS's client, which
// dials several servers and upgrades to TLS after its protocol's first
// line): the roots are the CA bundle as read now, so a rotated CA is used
// after a restart only; the client certificate is read at each handshake,
// as For's.
func (c *ClientTLS) Static() *tls.Config {
	cfg := c.base(c.f.ServerName)
	cfg.RootCAs = c.w.current().pool
	return cfg
}

// Dial is a dialer of TLS connections with For's configuration, for
// clients that take a dial function (go-redis's Options.Dialer).
func (c *ClientTLS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	d := tls.Dialer{Config: c.For(host)}
	return d.DialContext(ctx, network, addr)
}

// Credentials are gRPC transport credentials with For's configuration for
// each connection, by the authority dialled.
func (c *ClientTLS) Credentials() credentials.TransportCredentials {
	return clientCreds{TransportCredentials: credentials.NewTLS(c.For("")), c: c}
}

type clientCreds struct {
	credentials.TransportCredentials
	c *ClientTLS
}

func (cc clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	host, _, err := net.SplitHostPort(authority)
	if err != nil {
		host = authority
	}
	return credentials.NewTLS(cc.c.For(host)).ClientHandshake(ctx, authority, conn)
}

func (cc clientCreds) Clone() credentials.TransportCredentials {
	return clientCreds{TransportCredentials: cc.TransportCredentials.Clone(), c: cc.c}
}

// verify checks the peer's chain in cs against roots, for usage, and, when
// name is not empty, the leaf's name.
func verify(cs tls.ConnectionState, roots *x509.CertPool, name string, usage x509.ExtKeyUsage) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tlsfiles: the peer sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		DNSName:       name,
		Roots:         roots,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{usage},
	})
	return err
}

// Loopback reports whether addr, a host:port (or a gRPC target such as
// dns:///host:port), names a loopback address only: where plain text
// needs no TLS.
func Loopback(addr string) bool {
	if i := strings.LastIndex(addr, "/"); i >= 0 {
		addr = addr[i+1:]
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Identity is the name a verified peer certificate gives its holder: its
// first URI SAN (a SPIFFE ID, say), else its first DNS SAN, else its
// subject's common name; "" without a certificate.
func Identity(cs tls.ConnectionState) string {
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	c := cs.PeerCertificates[0]
	switch {
	case len(c.URIs) > 0:
		return c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	}
	return c.Subject.CommonName
}

// material is what the files held at their last good read.
type material struct {
	cert *tls.Certificate // nil without Cert
	pool *x509.CertPool   // nil without CA
}

// watcher holds the material of f and reads it again when a file's
// modification time or size changed, at most every checkEvery.
type watcher struct {
	f   Files
	log *slog.Logger

	mu      sync.Mutex
	m       material
	stamp   string // the files' times and sizes at the last read
	checked time.Time
}

func newWatcher(f Files) (*watcher, error) {
	w := &watcher{f: f, log: f.Logger}
	if w.log == nil {
		w.log = slog.Default()
	}
	m, err := load(f)
	if err != nil {
		return nil, err
	}
	w.m, w.stamp, w.checked = m, stamp(f), time.Now()
	return w, nil
}

func (w *watcher) current() material {
	w.mu.Lock()
	defer w.mu.Unlock()
	if now := time.Now(); now.Sub(w.checked) >= checkEvery {
		w.checked = now
		if s := stamp(w.f); s != w.stamp {
			m, err := load(w.f)
			if err != nil {
				// A rotation caught half-written is read again at
				// the next check; meanwhile the old files serve.
				w.log.Error("tls: reloading certificates; keeping the ones in use", "err", err)
			} else {
				w.m, w.stamp = m, s
				w.log.Info("tls: certificates reloaded", "cert", w.f.Cert, "ca", w.f.CA)
			}
		}
	}
	return w.m
}

// stamp describes the files' modification times and sizes.
func stamp(f Files) string {
	s := ""
	for _, p := range []string{f.Cert, f.Key, f.CA} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			s += fmt.Sprintf("%s:%d:%d;", p, fi.ModTime().UnixNano(), fi.Size())
		} else {
			s += p + ":missing;"
		}
	}
	return s
}

func load(f Files) (material, error) {
	var m material
	if f.Cert != "" || f.Key != "" {
		c, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return m, fmt.Errorf("%w: certificate %s, key %s: %w", ErrConfig, f.Cert, f.Key, err)
		}
		m.cert = &c
	}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return m, fmt.Errorf("%w: CA: %w", ErrConfig, err)
		}
		m.pool = x509.NewCertPool()
		if !m.pool.AppendCertsFromPEM(pem) {
			return m, fmt.Errorf("%w: CA %s: no PEM certificate", ErrConfig, f.CA)
		}
	}
	return m, nil
}
