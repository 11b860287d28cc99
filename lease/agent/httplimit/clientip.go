package httplimit

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// The client's address behind proxies. Each proxy appends the address it
// received the request from to X-Forwarded-For (or a for= element to
// Forwarded, RFC 7239), so the entries a client wrote itself are on the
// left, and only the entries on the right that trusted proxies appended can
// be believed: the client is the rightmost address that is not a trusted
// proxy, found by walking from the peer leftwards while each hop is one.

// clientIP returns r's client address: the peer's, or, when the peer is a
// trusted proxy, the rightmost forwarded address that is not one (the
// leftmost when all are), stopping at an entry that is not an address (an
// obfuscated or broken one: the hop before it is the last one known).
// Forwarded is read when present, else X-Forwarded-For; every header line of
// the one read counts, in order.
func (e *Extractor) clientIP(r *http.Request) string {
	peer := r.RemoteAddr
	if host, _, err := net.SplitHostPort(peer); err == nil {
		peer = host
	}
	if len(e.TrustedProxies) == 0 {
		return peer
	}
	cur, err := netip.ParseAddr(peer)
	if err != nil || !e.trusted(cur) {
		return peer
	}
	hops := forwardedHops(r)
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHop(hops[i])
		if !ok {
			break
		}
		cur = a
		if !e.trusted(a) {
			break
		}
	}
	return cur.String()
}

func (e *Extractor) trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range e.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwardedHops returns the addresses the forwarded headers list, left to
// right, unparsed: Forwarded's for= values when it is present, else
// X-Forwarded-For's entries.
func forwardedHops(r *http.Request) []string {
	var hops []string
	if fw := r.Header.Values("Forwarded"); len(fw) > 0 {
		for _, line := range fw {
			for elem := range strings.SplitSeq(line, ",") {
				v := ""
				for pair := range strings.SplitSeq(elem, ";") {
					k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
					if ok && strings.EqualFold(k, "for") {
						v = val
					}
				}
				// An element without for= is a hop whose address is
				// unknown: it stops the walk.
				hops = append(hops, v)
			}
		}
		return hops
	}
	for _, line := range r.Header.Values("X-Forwarded-For") {
		for entry := range strings.SplitSeq(line, ",") {
			hops = append(hops, entry)
		}
	}
	return hops
}

// parseHop parses one forwarded address: an IP, possibly quoted, an IPv6 in
// brackets, either with a port. "unknown" and obfuscated identifiers
// ("_hidden") are not addresses.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}
