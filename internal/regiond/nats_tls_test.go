package regiond

import (
	"net"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/internal/tlsfiles/tlstest"
	"github.com/ration-dev/ration/sync/embedded"
)

// TestNATSOverTLSWithNkeyUser: regiond's exchange connects to a NATS server
// (the embedded nats-server) that requires TLS with client certificates and
// accepts only an nkey user scoped to the region's own subject
// (-nats-ca, -nats-cert, -nats-key, -nats-nkey), and publishes its reports
// there with no permission error; a client without a certificate, or
// without the nkey, is refused.
func TestNATSOverTLSWithNkeyUser(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "nats CA")
	caPath := tlstest.Write(t, dir, "ca.pem", ca.PEM)
	sc, sk := ca.Issue(t, tlstest.Leaf{Name: "nats", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	cc, ck := ca.Issue(t, tlstest.Leaf{Name: "regiond-eu", Client: true})
	srvTLS, err := tlsfiles.Server(tlsfiles.Files{Cert: tlstest.Write(t, dir, "nats.pem", sc), Key: tlstest.Write(t, dir, "nats-key.pem", sk), CA: caPath})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	user := embedded.RegionUser("ration.sync", "eu", "")
	user.Password, user.Nkey = "", pub
	ns, err := embedded.Start(embedded.Config{TLS: srvTLS, Users: []embedded.User{user}})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()

	cert, key := tlstest.Write(t, dir, "client.pem", cc), tlstest.Write(t, dir, "client-key.pem", ck)
	seedPath := tlstest.Write(t, dir, "eu.nk", seed)
	d := startDaemon(t, Config{
		Region: "eu", Regions: []string{"eu"}, PolicyYAML: []byte(tlsPolicy), SyncPeriod: 100 * time.Millisecond,
		NATSURL: ns.ClientURL(), NATSCA: caPath, NATSCert: cert, NATSKey: key, NATSNkey: seedPath,
	})
	deadline := time.Now().Add(10 * time.Second)
	for metricSum(t, d, "ration_exchange_messages_published_total") < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the exchange published no report over NATS with TLS and an nkey user")
		}
		<-time.After(20 * time.Millisecond)
	}
	if n := metricSum(t, d, "ration_nats_async_errors_total"); n != 0 {
		t.Errorf("%v NATS errors (a permission violation?)", n)
	}

	ct, err := tlsfiles.Client(tlsfiles.Files{CA: caPath})
	if err != nil {
		t.Fatal(err)
	}
	nk, err := nats.NkeyOptionFromSeed(seedPath)
	if err != nil {
		t.Fatal(err)
	}
	withCert, err := tlsfiles.Client(tlsfiles.Files{CA: caPath, Cert: cert, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]nats.Option{
		"no client certificate": {nats.Secure(ct.Static()), nk},
		"no nkey":               {nats.Secure(withCert.Static())},
	} {
		if nc, err := nats.Connect(ns.ClientURL(), append(opts, nats.Timeout(2*time.Second))...); err == nil {
			nc.Close()
			t.Errorf("%s: the connection was accepted", name)
		}
	}
}

// TestNATSCredsUser: regiond's exchange connects to a NATS in operator
// mode with a .creds file (-nats-creds) of a user whose JWT allows
// publishing its region's reports only, and publishes there without a
// permission error; the same server refuses a client without credentials.
func TestNATSCredsUser(t *testing.T) {
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	ojwt, err := oc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ajwt, err := ac.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	useed, _ := ukp.Seed()
	uc := jwt.NewUserClaims(upub)
	uc.Pub.Allow.Add("ration.sync.eu")
	uc.Sub.Allow.Add("ration.sync.>")
	ujwt, err := uc.Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(ujwt, useed)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := embedded.Start(embedded.Config{Operator: &embedded.Operator{JWT: ojwt, Accounts: []string{ajwt}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	d := startDaemon(t, Config{
		Region: "eu", Regions: []string{"eu"}, PolicyYAML: []byte(tlsPolicy), SyncPeriod: 100 * time.Millisecond,
		NATSURL: ns.ClientURL(), NATSCreds: tlstest.Write(t, t.TempDir(), "eu.creds", creds),
	})
	deadline := time.Now().Add(10 * time.Second)
	for metricSum(t, d, "ration_exchange_messages_received_total") < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the exchange received none of its reports over NATS as a .creds user")
		}
		<-time.After(20 * time.Millisecond)
	}
	if n := metricSum(t, d, "ration_nats_async_errors_total"); n != 0 {
		t.Errorf("%v NATS errors (a permission violation?)", n)
	}
	if nc, err := nats.Connect(ns.ClientURL(), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Error("a client without credentials was accepted")
	}
}
