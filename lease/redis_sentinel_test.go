package lease

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
)

func TestParseRedisSentinel(t *testing.T) {
	type want struct {
		Master                     string
		Sentinels                  []string
		User, Password             string
		SentinelUser, SentinelPass string
		DB                         int
		TLS                        bool
		Dial, Read, Write          time.Duration
	}
	def := func(w want) want {
		if w.Dial == 0 {
			w.Dial = defaultDialTimeout
		}
		if w.Read == 0 {
			w.Read = defaultIOTimeout
		}
		if w.Write == 0 {
			w.Write = defaultIOTimeout
		}
		return w
	}
	for _, tc := range []struct {
		in   string
		want want
	}{
		{"redis-sentinel://127.0.0.1:26379/mymaster", want{Master: "mymaster", Sentinels: []string{"127.0.0.1:26379"}}},
		{"redis-sentinel://h1:26379,h2:26380,h3:26381/ration?db=2",
			want{Master: "ration", Sentinels: []string{"h1:26379", "h2:26380", "h3:26381"}, DB: 2}},
		{"  REDIS-SENTINEL://u:p%40ss@h1:1,[::1]:2/m  ",
			want{Master: "m", Sentinels: []string{"h1:1", "[::1]:2"}, User: "u", Password: "p@ss"}},
		{"redis-sentinel://:secret@h:1/m", want{Master: "m", Sentinels: []string{"h:1"}, Password: "secret"}},
		{"rediss-sentinel://h:1/m?sentinel_username=s&sentinel_password=sp",
			want{Master: "m", Sentinels: []string{"h:1"}, SentinelUser: "s", SentinelPass: "sp", TLS: true}},
		// A master name may hold characters a URL escapes (not white space).
		{"redis-sentinel://h:1/a%2Bb", want{Master: "a+b", Sentinels: []string{"h:1"}}},
		{"redis-sentinel://h:1/m?dial_timeout=2s&read_timeout=3&write_timeout=750ms",
			want{Master: "m", Sentinels: []string{"h:1"}, Dial: 2 * time.Second, Read: 3 * time.Second, Write: 750 * time.Millisecond}},
	} {
		o, err := parseRedisSentinel(tc.in)
		if err != nil {
			t.Errorf("parseRedisSentinel(%q): %v", tc.in, err)
			continue
		}
		got := want{Master: o.MasterName, Sentinels: o.SentinelAddrs, User: o.Username, Password: o.Password,
			SentinelUser: o.SentinelUsername, SentinelPass: o.SentinelPassword, DB: o.DB, TLS: o.TLSConfig != nil,
			Dial: o.DialTimeout, Read: o.ReadTimeout, Write: o.WriteTimeout}
		if diff := cmp.Diff(def(tc.want), got); diff != "" {
			t.Errorf("parseRedisSentinel(%q) (-want +got):\n%s", tc.in, diff)
		}
		if !o.ContextTimeoutEnabled {
			t.Errorf("parseRedisSentinel(%q): ContextTimeoutEnabled not set", tc.in)
		}
	}
	// Each node is verified against the host it dials, not one fixed name.
	if o, err := parseRedisSentinel("rediss-sentinel://h:1/m"); err != nil || o.TLSConfig.ServerName != "" {
		t.Errorf("rediss-sentinel: got %+v, %v; want TLS without a fixed server name", o, err)
	}

	for _, bad := range []string{
		"redis-sentinel://",                         // nothing
		"redis-sentinel:///m",                       // no sentinel address
		"redis-sentinel://u:p@/m",                   // no sentinel address after the user
		"redis-sentinel://h:1",                      // no master name
		"redis-sentinel://h:1/",                     // empty master name
		"redis-sentinel://h:1/a/b",                  // two path segments
		"redis-sentinel://h:1/m%20x",                // white space in the master name
		"redis-sentinel://h:1,,h:2/m",               // empty element
		"redis-sentinel://h:1,/m",                   // empty last element
		"redis-sentinel://h/m",                      // no port
		"redis-sentinel://:1/m",                     // no host
		"redis-sentinel://h:0/m",                    // port 0
		"redis-sentinel://h:65536/m",                // port too large
		"redis-sentinel://h:x/m",                    // port not a number
		"redis-sentinel://h:1/m?bogus=1",            // unknown option
		"redis-sentinel://h:1/m?master_name=x",      // go-redis's option, not ours
		"redis-sentinel://h:1/m?db=-1",              // bad db
		"redis-sentinel://h:1/m?db=x",               // bad db
		"redis-sentinel://h:1/m?db=1&db=2",          // an option twice
		"redis-sentinel://h:1/m?dial_timeout=0",     // zero timeout
		"redis-sentinel://h:1/m?read_timeout=-1s",   // negative timeout
		"redis-sentinel://h:1/m?write_timeout=soon", // not a duration
		"redis-sentinel://h:1/m?a=%zz",              // bad escape
		"redis-sentinel://h:1/m#frag",               // a fragment
		"redis://h:1/0",                             // not a sentinel address
	} {
		_, err := parseRedisSentinel(bad)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("parseRedisSentinel(%q): got %v, want ErrInvalid", bad, err)
			continue
		}
		if !strings.Contains(err.Error(), "sentinel") {
			t.Errorf("parseRedisSentinel(%q): error %q does not say it is about a sentinel address", bad, err)
		}
	}
	// Through the constructor too: a bad Sentinel address builds nothing.
	if c, err := NewRedisClient("redis-sentinel://h:1"); !errors.Is(err, ErrInvalid) || c != nil {
		t.Errorf("NewRedisClient without a master name: got %v, %v; want ErrInvalid", c, err)
	}
}

// TestNewRedisClientSentinel: a Sentinel address gives a failover client
// (a *redis.Client, so the store's Incarnation asks the current master)
// without dialling anything yet, and the TLS dial hook replaces the URL's
// TLS for the sentinels and the data nodes alike.
func TestNewRedisClientSentinel(t *testing.T) {
	c, err := NewRedisClient("rediss-sentinel://127.0.0.1:1,127.0.0.1:2/ration?db=3")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, ok := c.(*redis.Client)
	if !ok {
		t.Fatalf("got a %T, want a *redis.Client (go-redis's failover client)", c)
	}
	if o := rc.Options(); o.DB != 3 || !o.ContextTimeoutEnabled || o.DialTimeout != defaultDialTimeout || o.TLSConfig == nil {
		t.Errorf("got options %+v, want db 3, context timeouts, the default dial timeout and TLS", o)
	}
	if _, err := NewRedisStore(c, RedisConfig{}); err != nil {
		t.Errorf("NewRedisStore on a failover client: %v", err)
	}
}

// FuzzParseRedisSentinel: any string after a Sentinel scheme gives an
// ErrInvalid error or options that name a master and at least one
// sentinel and build a client, never a panic.
func FuzzParseRedisSentinel(f *testing.F) {
	for _, a := range []string{"h:1/m", "u:p@h1:1,h2:2/m?db=1", "h:1/m?dial_timeout=1s&sentinel_password=x", ",/m", "[::1]:1/m", "h:1/%", "@/", "h:1/m?db=9999999999999999999"} {
		f.Add(a, false)
		f.Add(a, true)
	}
	f.Fuzz(func(t *testing.T, rest string, useTLS bool) {
		addr := sentinelScheme + rest
		if useTLS {
			addr = sentinelTLSScheme + rest
		}
		o, err := parseRedisSentinel(addr)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("parseRedisSentinel(%q): error %v does not wrap ErrInvalid", addr, err)
			}
			return
		}
		if o.MasterName == "" || len(o.SentinelAddrs) == 0 || !o.ContextTimeoutEnabled || o.DialTimeout <= 0 || o.DB < 0 || (o.TLSConfig != nil) != useTLS {
			t.Fatalf("parseRedisSentinel(%q): got %+v", addr, o)
		}
		// Building the client dials nothing; it must not panic either.
		if err := redis.NewFailoverClient(o).Close(); err != nil {
			t.Fatalf("closing the failover client of %q: %v", addr, err)
		}
	})
}
