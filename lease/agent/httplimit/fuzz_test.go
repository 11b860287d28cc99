package httplimit

import (
	"net"
	"net/http/httptest"
	"testing"
	"unicode/utf8"
)

// FuzzExtractor feeds arbitrary forwarded headers, peer addresses and API
// keys to the extractor: it must never panic, the ip descriptor must be a
// parseable address or the peer's own address, and a forwarded header is
// believed only when TrustForwarded says so.
func FuzzExtractor(f *testing.F) {
	f.Add("198.51.100.1, 10.0.0.1", "192.0.2.7:5555", "key", true)
	f.Add("", "[2001:db8::1]:443", "", false)
	f.Add("not an ip", "garbage", "k\x00ey", true)
	f.Fuzz(func(t *testing.T, xff, remote, key string, trust bool) {
		r := httptest.NewRequest("GET", "/x", nil)
		r.RemoteAddr = remote
		if utf8.ValidString(xff) {
			r.Header.Set("X-Forwarded-For", xff)
		}
		r.Header.Set("X-API-Key", key)
		e := Extractor{TrustForwarded: trust, APIKeyHeader: "X-API-Key"}
		ds := e.Descriptors(r, nil)
		var ip string
		for _, d := range ds {
			if d.Key == DescIP {
				ip = d.Value
			}
		}
		peer := remote
		if host, _, err := net.SplitHostPort(remote); err == nil {
			peer = host
		}
		if ip != peer && (!trust || net.ParseIP(ip) == nil) {
			t.Errorf("ip %q from xff %q remote %q trust %v: neither the peer nor a trusted forwarded address", ip, xff, remote, trust)
		}
	})
}
