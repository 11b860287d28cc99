package tlsfiles

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/tlsfiles/tlstest"
)

// pair is a server's and a client's files, under one CA each side trusts.
type pair struct {
	dir            string
	ca             *tlstest.CA
	server, client Files
}

func newPair(t *testing.T) *pair {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "ration test CA")
	p := &pair{dir: dir, ca: ca}
	caPath := tlstest.Write(t, dir, "ca.pem", ca.PEM)
	sc, sk := ca.Issue(t, tlstest.Leaf{Name: "regiond", DNS: []string{"regiond.eu"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	cc, ck := ca.Issue(t, tlstest.Leaf{Name: "agent", URIs: []string{"spiffe://example.org/gateway"}, Client: true})
	p.server = Files{Cert: tlstest.Write(t, dir, "server.pem", sc), Key: tlstest.Write(t, dir, "server-key.pem", sk), CA: caPath}
	p.client = Files{Cert: tlstest.Write(t, dir, "client.pem", cc), Key: tlstest.Write(t, dir, "client-key.pem", ck), CA: caPath, ServerName: "regiond.eu"}
	return p
}

// serve accepts TLS connections on loopback with cfg, completes each
// handshake and reports the client's identity (or the handshake's error)
// on the returned channel, until the test ends.
func serve(t *testing.T, cfg *tls.Config) (string, <-chan string) {
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			tc.SetDeadline(time.Now().Add(5 * time.Second))
			if err := tc.Handshake(); err != nil {
				out <- "error: " + err.Error()
			} else {
				out <- Identity(tc.ConnectionState())
				io.WriteString(tc, "ok")
			}
			tc.Close()
		}
	}()
	t.Cleanup(func() { lis.Close(); <-done })
	return lis.Addr().String(), out
}

// dial connects with cfg and reads the server's "ok"; the error is the
// handshake's, as the client sees it.
func dial(addr string, cfg *tls.Config) (*tls.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 2)
	if _, err := io.ReadFull(c, b); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func TestMutualTLS(t *testing.T) {
	p := newPair(t)
	scfg, err := Server(p.server)
	if err != nil {
		t.Fatal(err)
	}
	addr, got := serve(t, scfg)
	ccfg, err := Client(p.client)
	if err != nil {
		t.Fatal(err)
	}
	c, err := dial(addr, ccfg.For(""))
	if err != nil {
		t.Fatalf("a client with a valid certificate: %v", err)
	}
	c.Close()
	if id := <-got; id != "spiffe://example.org/gateway" {
		t.Fatalf("the server saw identity %q, want the client's URI SAN", id)
	}

	other := tlstest.NewCA(t, "another CA")
	oc, ok := other.Issue(t, tlstest.Leaf{Name: "intruder", Client: true})
	ec, ek := p.ca.Issue(t, tlstest.Leaf{Name: "old", Client: true, NotAfter: time.Now().Add(-time.Minute)})
	for _, tc := range []struct {
		name string
		f    Files
	}{
		{"no certificate", Files{CA: p.client.CA, ServerName: "regiond.eu"}},
		{"another CA", Files{Cert: tlstest.Write(t, p.dir, "o.pem", oc), Key: tlstest.Write(t, p.dir, "ok.pem", ok), CA: p.client.CA, ServerName: "regiond.eu"}},
		{"expired", Files{Cert: tlstest.Write(t, p.dir, "e.pem", ec), Key: tlstest.Write(t, p.dir, "ek.pem", ek), CA: p.client.CA, ServerName: "regiond.eu"}},
	} {
		cfg, err := Client(tc.f)
		if err != nil {
			t.Fatal(err)
		}
		if c, err := dial(addr, cfg.For("")); err == nil {
			c.Close()
			t.Errorf("%s: the connection was accepted", tc.name)
		}
		if s := <-got; len(s) < 6 || s[:6] != "error:" {
			t.Errorf("%s: the server completed the handshake (%q)", tc.name, s)
		}
	}

	// A client that expects another name, or trusts another CA, refuses
	// the server.
	for _, f := range []Files{
		{CA: p.client.CA, ServerName: "regiond.us", Cert: p.client.Cert, Key: p.client.Key},
		{CA: tlstest.Write(t, p.dir, "other-ca.pem", other.PEM), ServerName: "regiond.eu", Cert: p.client.Cert, Key: p.client.Key},
	} {
		cfg, err := Client(f)
		if err != nil {
			t.Fatal(err)
		}
		if c, err := dial(addr, cfg.For("")); err == nil {
			c.Close()
			t.Errorf("a client of %s / %s accepted the server", f.CA, f.ServerName)
		}
		<-got
	}
}

func TestRotation(t *testing.T) {
	checkEvery = 0
	t.Cleanup(func() { checkEvery = time.Second })
	p := newPair(t)
	scfg, err := Server(p.server)
	if err != nil {
		t.Fatal(err)
	}
	addr, got := serve(t, scfg)
	ccfg, err := Client(p.client)
	if err != nil {
		t.Fatal(err)
	}
	serial := func() string {
		t.Helper()
		c, err := dial(addr, ccfg.For(""))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		<-got
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serial()
	// The server's certificate rotates on disk: the next handshake uses it.
	sc, sk := p.ca.Issue(t, tlstest.Leaf{Name: "regiond", DNS: []string{"regiond.eu"}, Server: true})
	tlstest.Write(t, p.dir, "server-key.pem", sk)
	tlstest.Write(t, p.dir, "server.pem", sc)
	if after := serial(); after == before {
		t.Fatalf("the server still presents certificate %s after its rotation", after)
	}
	// The CA rotates on both sides (a new CA, new leaves): still one trust.
	ca2 := tlstest.NewCA(t, "rotated CA")
	bundle := append(append([]byte{}, p.ca.PEM...), ca2.PEM...)
	tlstest.Write(t, p.dir, "ca.pem", bundle)
	cc, ck := ca2.Issue(t, tlstest.Leaf{Name: "agent", DNS: []string{"agent.eu"}, Client: true})
	tlstest.Write(t, p.dir, "client-key.pem", ck)
	tlstest.Write(t, p.dir, "client.pem", cc)
	c, err := dial(addr, ccfg.For(""))
	if err != nil {
		t.Fatalf("after the CA's rotation: %v", err)
	}
	c.Close()
	if id := <-got; id != "agent.eu" {
		t.Fatalf("the server saw %q after the rotation, want the new client certificate's agent.eu", id)
	}
	// A rotation caught half-written keeps the files in use.
	tlstest.Write(t, p.dir, "server.pem", []byte("not a certificate"))
	if _, err := dial(addr, ccfg.For("")); err != nil {
		t.Fatalf("with a broken file on disk the server should keep its certificate: %v", err)
	}
	<-got
}

func TestBadFiles(t *testing.T) {
	p := newPair(t)
	for _, f := range []Files{
		{Cert: p.server.Cert},
		{Cert: p.server.Cert, Key: p.client.Key},
		{Cert: p.server.Cert, Key: p.server.Key, CA: p.server.Key},
		{Cert: p.dir + "/missing.pem", Key: p.server.Key},
	} {
		if _, err := Server(f); !errors.Is(err, ErrConfig) {
			t.Errorf("Server(%+v): got %v, want ErrConfig", f, err)
		}
	}
	if _, err := Client(Files{Key: p.client.Key}); !errors.Is(err, ErrConfig) {
		t.Errorf("Client with a key alone: got %v, want ErrConfig", err)
	}
}
