package httplimit

import (
	"net"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzExtractor feeds arbitrary forwarded headers, peer addresses and API
// keys to the extractor: it must never panic; the ip descriptor is the
// peer's own address unless the peer is a trusted proxy, and then an
// address the headers carry; what a client prepends to a header never
// changes it (the same request with junk on the left gets the same IP).
func FuzzExtractor(f *testing.F) {
	f.Add("198.51.100.1, 10.0.0.1", "", "10.0.0.7:5555", "key", "6.6.6.6")
	f.Add("", "for=\"[2001:db8::1]:443\"", "[2001:db8::1]:443", "", "junk")
	f.Add("not an ip", "for=_x", "garbage", "k\x00ey", "")
	f.Fuzz(func(t *testing.T, xff, fwd, remote, key, spoof string) {
		e := Extractor{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, APIKeyHeader: "X-API-Key"}
		ipOf := func(xff, fwd string) string {
			r := httptest.NewRequest("GET", "/x", nil)
			r.RemoteAddr = remote
			if utf8.ValidString(xff) && xff != "" {
				r.Header.Set("X-Forwarded-For", xff)
			}
			if utf8.ValidString(fwd) && fwd != "" {
				r.Header.Set("Forwarded", fwd)
			}
			r.Header.Set("X-API-Key", key)
			for _, d := range e.Descriptors(r, nil) {
				if d.Key == DescIP {
					return d.Value
				}
			}
			t.Fatal("no ip descriptor")
			return ""
		}
		ip := ipOf(xff, fwd)
		peer := remote
		if host, _, err := net.SplitHostPort(remote); err == nil {
			peer = host
		}
		pa, err := netip.ParseAddr(peer)
		if err != nil || !e.trusted(pa) {
			if ip != peer {
				t.Fatalf("untrusted peer %q: got ip %q", remote, ip)
			}
			return
		}
		ia, err := netip.ParseAddr(ip)
		if err != nil {
			t.Fatalf("ip %q from xff %q forwarded %q peer %q: not an address", ip, xff, fwd, remote)
		}
		if e.trusted(ia) {
			// Every hop was a trusted proxy (the leftmost is taken): the
			// request came from inside the trusted network, and an address
			// on the left is the first untrusted one by the same rule.
			return
		}
		// A client's own prefix (junk or addresses, joined with a comma)
		// changes nothing.
		if strings.ContainsAny(spoof, "\r\n") || !utf8.ValidString(spoof) {
			return
		}
		if fwd != "" && utf8.ValidString(fwd) {
			if got := ipOf(xff, "for="+spoof+", "+fwd); got != ip && !strings.Contains(fwd+spoof, "\"") {
				t.Fatalf("a spoofed Forwarded prefix %q moved the ip from %q to %q (%q)", spoof, ip, got, fwd)
			}
			return
		}
		if xff != "" && utf8.ValidString(xff) {
			if got := ipOf(spoof+", "+xff, fwd); got != ip {
				t.Fatalf("a spoofed X-Forwarded-For prefix %q moved the ip from %q to %q (%q)", spoof, ip, got, xff)
			}
		}
	})
}
