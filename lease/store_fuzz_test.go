package lease

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

// unescapeKey inverts keyEscaper, to show that escaping is injective.
var unescapeKey = strings.NewReplacer("%7D", "}", "%7B", "{", "%25", "%")

// FuzzRedisKeyEscape: whatever a key contains, its own Redis names carry
// one hash tag that is exactly the escaped key, escaping is injective, so
// two keys never share state, and its group's tag lies in the same Cluster
// slot, so a script can touch all of a key's names on a Cluster (in either
// layout, whichever groups a Cluster allows); its field in the group is at
// most 41 bytes and the key itself up to 40.
func FuzzRedisKeyEscape(f *testing.F) {
	for _, k := range []string{"acme", "{", "}", "{a}", "}{", "%7B", "%%7D{", "tenant=acme|route=/v1/{id}", strings.Repeat("long", 11)} {
		f.Add(k)
	}
	var stores []*RedisStore
	for _, c := range []RedisConfig{{}, {Layout: LayoutGroups, Groups: clusterSlots}, {Layout: LayoutGroups, Groups: 1 << 20}} {
		c = c.withDefaults()
		stores = append(stores, &RedisStore{cfg: c})
	}
	tag := func(t *testing.T, name string) string {
		open := strings.IndexByte(name, '{')
		close := strings.IndexByte(name[open+1:], '}')
		if open < 0 || close < 1 {
			t.Fatalf("name %q has no hash tag", name)
		}
		return name[open+1 : open+1+close]
	}
	f.Fuzz(func(t *testing.T, key string) {
		if key == "" {
			return // not a key (validateKey)
		}
		esc := keyEscaper.Replace(key)
		if strings.ContainsAny(esc, "{}") {
			t.Fatalf("escaped %q to %q, which contains a brace", key, esc)
		}
		if got := unescapeKey.Replace(esc); got != key {
			t.Fatalf("escaped %q to %q, which unescapes to %q", key, esc, got)
		}
		for _, s := range stores {
			names := s.keyNames(key)
			own, group := names[0], names[1]
			if s.cfg.Layout == LayoutGroups {
				own, group = group, own
			}
			for _, name := range []string{own, names[2], names[3]} {
				if tag(t, name) != esc {
					t.Fatalf("name %q: hash tag is not the escaped key %q", name, esc)
				}
			}
			if !strings.HasPrefix(group, s.cfg.Prefix+"g{") || crc16(tag(t, group))%clusterSlots != crc16(esc)%clusterSlots {
				t.Fatalf("group %q of %q is not in the key's slot %d", group, key, crc16(esc)%clusterSlots)
			}
		}
		if f := groupField(key); len(f) > maxFieldKey+1 || (len(key) <= maxFieldKey) != (f == key) {
			t.Fatalf("field of %q: %q", key, f)
		}
	})
}

// FuzzParseRedisAddr: any address string gives an error or exactly one
// usable client configuration, never a panic.
func FuzzParseRedisAddr(f *testing.F) {
	for _, a := range []string{"redis://127.0.0.1:6379", "rediss://u:p@h:1/0?dial_timeout=1s", "a:1,b:2", "redis://a:1,b:2", "unix:///s", ",", "redis://[::1]", "%"} {
		f.Add(a)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		single, cluster, err := parseRedisAddr(addr)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("parseRedisAddr(%q): error %v does not wrap ErrInvalid", addr, err)
			}
			return
		}
		switch {
		case (single == nil) == (cluster == nil):
			t.Fatalf("parseRedisAddr(%q): got single %v and cluster %v, want exactly one", addr, single, cluster)
		case single != nil && (single.Addr == "" || !single.ContextTimeoutEnabled):
			t.Fatalf("parseRedisAddr(%q): got %+v", addr, single)
		case cluster != nil && (len(cluster.Addrs) < 2 || !cluster.ContextTimeoutEnabled):
			t.Fatalf("parseRedisAddr(%q): got %+v", addr, cluster)
		}
	})
}

// FuzzParseScriptReply: a malformed script reply is an error, never a
// panic or a grant of a negative or non-numeric amount.
func FuzzParseScriptReply(f *testing.F) {
	f.Add(int64(3), "0.5", int64(region.PPM), int64(0), int64(0), false)
	f.Add(int64(-1), "NaN", int64(-5), int64(-1), int64(7), true)
	f.Add(int64(0), "1e400", int64(region.PPM+1), int64(5), int64(-3), false)
	f.Fuzz(func(t *testing.T, granted int64, tokens string, share, untilEnd, window int64, short bool) {
		reply := []any{granted, tokens, share, untilEnd, window}
		if short {
			reply = reply[:3]
		}
		r, err := parseScriptReply(reply)
		if err != nil {
			return
		}
		if short || r.granted < 0 || r.sharePPM < 0 || r.sharePPM > region.PPM || math.IsNaN(r.tokens) || r.untilEnd < 0 || r.window < 0 {
			t.Fatalf("parseScriptReply(%#v) = %+v, want an error", reply, r)
		}
	})
}

// FuzzMemoryGrant: for any limit, share, want and elapsed time, a grant is
// a whole number of costs, never above want or capacity, never leaves a
// negative or NaN balance, and is rejected with ErrInvalid (debiting
// nothing) exactly when the contract says the item is invalid.
func FuzzMemoryGrant(f *testing.F) {
	f.Add(10.0, 20.0, int64(1), int64(region.PPM), int64(15), int64(5), int64(1_000_000), false)
	f.Add(math.NaN(), 20.0, int64(1), int64(region.PPM), int64(1), int64(1), int64(0), false)
	f.Add(1e-300, 1e300, int64(7), int64(1), int64(1<<40), int64(9), int64(-5_000_000), true)
	f.Add(1e9, 3.0, int64(3), int64(0), int64(3), int64(3), int64(1<<50), false)
	f.Fuzz(func(t *testing.T, rate, burst float64, cost, share, want1, want2, elapsedUS int64, empty bool) {
		l := Limit{Rate: rate, Burst: burst, Cost: cost, InitialShare: share, StartEmpty: empty}
		m := NewMemoryStore(MemoryConfig{Shards: 1})
		elapsedUS %= 1 << 45 // about a year either way
		out := make([]Grant, 2)
		m.GrantAt(epoch, []GrantRequest{{Key: "k", Want: want1, Limit: l}}, out[:1])
		m.GrantAt(epoch.Add(time.Duration(elapsedUS)*time.Microsecond), []GrantRequest{{Key: "k", Want: want2, Limit: l}}, out[1:])
		for i, want := range []int64{want1, want2} {
			g := out[i]
			valid := validateGrant(GrantRequest{Key: "k", Want: want, Limit: l}) == nil
			if !valid {
				if !errors.Is(g.Err, ErrInvalid) || g.Granted != 0 {
					t.Fatalf("grant %d of %d with %+v: got %+v, want ErrInvalid", i, want, l, g)
				}
				continue
			}
			if g.Err != nil || g.Granted < 0 || g.Granted > want || g.Granted%cost != 0 ||
				float64(g.Granted) > g.Capacity || !(g.Tokens >= 0) || g.Tokens > g.Capacity || g.RetryAfter < 0 ||
				(g.Granted == 0) != (g.RetryAfter > 0) {
				t.Fatalf("grant %d of %d with %+v: got %+v", i, want, l, g)
			}
		}
	})
}

// FuzzRedisState: any value in a key's Redis key decodes to a state or an
// error, never a panic, and a long form that decodes encodes back to
// itself, so Go and the script read every field at the same place.
func FuzzRedisState(f *testing.F) {
	f.Add(redisState{tokens: 3.5, last: 1 << 50}.encode())
	f.Add(redisState{tokens: 0.1, last: 1 << 50, win: 1 << 49, hasShare: true, share: 500_000, bucketExpire: 1 << 40, gen: 7, credited: 12_345, window: 1 << 49}.encode())
	f.Add("0123456789ab")
	f.Add("\x0f")
	f.Fuzz(func(t *testing.T, v string) {
		st, err := decodeRedisState(v, 1<<40)
		if err != nil || len(v) == shortStateLen {
			return
		}
		if st.share < 0 || st.share > region.PPM {
			t.Fatalf("decoded %q to share %d", v, st.share)
		}
		// Flags the script never writes (an escrow without a share) are
		// read but not written back; the rest round-trips.
		if f := v[0]; f&stateShare == 0 && f&(stateEscrow|stateEscrowWindow) != 0 ||
			f&stateEscrow == 0 && f&stateEscrowWindow != 0 || st.gen == 0 && f&stateEscrow != 0 ||
			st.win == 0 && f&stateWindow != 0 || st.window == 0 && f&stateEscrowWindow != 0 {
			return
		}
		if got := st.encode(); got != v {
			t.Fatalf("decoded %q to %+v, which encodes to %q", v, st, got)
		}
	})
}

// FuzzRedisGroupValue: any value of a group's field decodes to an expiry
// and a state or to an error, never a panic, and a long form that decodes
// encodes to a value that decodes to the same encoding (flags the script
// never writes, such as an escrow of generation 0, are dropped once).
func FuzzRedisGroupValue(f *testing.F) {
	f.Add(groupValue(1<<40, redisState{tokens: 3.5, last: 1 << 50}.encode()))
	f.Add(groupValue(0, redisState{tokens: 1, last: 1, hasShare: true, share: 5, gen: 2, credited: 3}.encode()))
	f.Add(groupValue(1<<40, "0123456789ab"))
	f.Add("\x00\x00\x00\x00\x00\x00")
	f.Fuzz(func(t *testing.T, v string) {
		exp, st, err := decodeGroupValue(v)
		if err != nil {
			return
		}
		if exp < 0 || exp >= 1<<48 || st.share < 0 || st.share > region.PPM {
			t.Fatalf("decoded %q to expiry %d, %+v", v, exp, st)
		}
		if len(v) == 6+shortStateLen {
			if exp == 0 {
				t.Fatalf("decoded %q, a short state that never expires", v)
			}
			return
		}
		canon := st.encode()
		if _, back, err := decodeGroupValue(groupValue(exp, canon)); err != nil || back.encode() != canon {
			t.Fatalf("decoded %q to %+v, which encodes to %q, decoding to %+v, %v", v, st, canon, back, err)
		}
	})
}
