package lease

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
)

func TestNewRedisStoreConfig(t *testing.T) {
	good, err := NewRedisClient("redis://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer plain.Close()

	s, err := NewRedisStore(good, RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(RedisConfig{Prefix: "ration:", Timeout: 50 * time.Millisecond, ShareTTL: 24 * time.Hour, Layout: LayoutKeys, Groups: 1 << 17}, s.cfg); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if got, want := s.stateKey("t{e}n%ant"), "ration:{t%7Be%7Dn%25ant}"; got != want {
		t.Errorf("got state key %q, want %q", got, want)
	}
	// The key's own name, its group (in the same slot: "5oM" and "acme"
	// are both in slot 7,217, and 7 is its sub-group of 8), and the names
	// before issue 12, which the script still reads.
	if got, want := s.keyNames("acme"), []string{"ration:{acme}", "ration:g{5oM}7", "ration:{acme}:b", "ration:{acme}:s"}; !slices.Equal(got, want) {
		t.Errorf("got key names %q, want %q", got, want)
	}
	g, err := NewRedisStore(good, RedisConfig{Layout: LayoutGroups, Groups: 16})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := g.keyNames("acme"), []string{"ration:g{0QG}", "ration:{acme}", "ration:{acme}:b", "ration:{acme}:s"}; !slices.Equal(got, want) {
		t.Errorf("LayoutGroups: got key names %q, want %q", got, want)
	}
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true})
	defer cluster.Close()
	if _, err := NewRedisStore(cluster, RedisConfig{Layout: LayoutGroups, Groups: 1 << 14}); err != nil {
		t.Errorf("16,384 groups on a cluster: %v", err)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: true})
	defer ring.Close()
	for name, tc := range map[string]struct {
		client redis.UniversalClient
		cfg    RedisConfig
	}{
		"nil client":         {nil, RedisConfig{}},
		"brace in prefix":    {good, RedisConfig{Prefix: "r{x}:"}},
		"negative timeout":   {good, RedisConfig{Timeout: -time.Second}},
		"negative share TTL": {good, RedisConfig{ShareTTL: -time.Second}},
		"share TTL too long": {good, RedisConfig{ShareTTL: 1 << 62}},
		"no context timeout": {plain, RedisConfig{}},
		"unknown layout":     {good, RedisConfig{Layout: 2}},
		"groups not 2^n":     {good, RedisConfig{Groups: 100}},
		"negative groups":    {good, RedisConfig{Groups: -4}},
		"too many groups":    {good, RedisConfig{Groups: 1 << 25}},
		// Even with the keys layout: it reads a key's group while a
		// region switches layouts.
		"few groups on a cluster": {cluster, RedisConfig{Groups: 1 << 13}},
		"groups on a ring":        {ring, RedisConfig{Layout: LayoutGroups}},
	} {
		if _, err := NewRedisStore(tc.client, tc.cfg); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
}

func TestParseRedisLayout(t *testing.T) {
	for _, l := range []RedisLayout{LayoutKeys, LayoutGroups} {
		if got, err := ParseRedisLayout(l.String()); err != nil || got != l {
			t.Errorf("ParseRedisLayout(%q): got %v, %v; want %v", l.String(), got, err, l)
		}
	}
	for _, bad := range []string{"", "Keys", "group", "RedisLayout(2)"} {
		if _, err := ParseRedisLayout(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRedisLayout(%q): got %v, want ErrInvalid", bad, err)
		}
	}
}

func TestParseRedisAddr(t *testing.T) {
	type want struct {
		Single  string   // Addr of a single-node client
		Cluster []string // Addrs of a cluster client
		TLS     bool
		Dial    time.Duration
	}
	for _, tc := range []struct {
		in   string
		want want
	}{
		{"redis://127.0.0.1:6379", want{Single: "127.0.0.1:6379", Dial: defaultDialTimeout}},
		{"redis://h?dial_timeout=2s", want{Single: "h:6379", Dial: 2 * time.Second}},
		{"rediss://user:pw@cache.example:6380/2", want{Single: "cache.example:6380", TLS: true, Dial: defaultDialTimeout}},
		{"unix:///run/redis.sock", want{Single: "/run/redis.sock", Dial: defaultDialTimeout}},
		{"a:7000, b:7001,c:7002", want{Cluster: []string{"a:7000", "b:7001", "c:7002"}, Dial: defaultDialTimeout}},
		{"rediss://u:p@a:7000,b:7001", want{Cluster: []string{"a:7000", "b:7001"}, TLS: true, Dial: defaultDialTimeout}},
	} {
		single, cluster, err := parseRedisAddr(tc.in)
		if err != nil {
			t.Errorf("parseRedisAddr(%q): %v", tc.in, err)
			continue
		}
		var got want
		if single != nil {
			got = want{Single: single.Addr, TLS: single.TLSConfig != nil, Dial: single.DialTimeout}
			if !single.ContextTimeoutEnabled {
				t.Errorf("%q: ContextTimeoutEnabled not set", tc.in)
			}
		} else {
			got = want{Cluster: cluster.Addrs, TLS: cluster.TLSConfig != nil, Dial: cluster.DialTimeout}
			if !cluster.ContextTimeoutEnabled {
				t.Errorf("%q: ContextTimeoutEnabled not set", tc.in)
			}
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("parseRedisAddr(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
	for _, bad := range []string{"", "  ", "http://x", "redis://h/1/2", "a:1,,b:2", "a:1,nohost", "a:1,unix:///s", "redis://h?bogus=1"} {
		if _, _, err := parseRedisAddr(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("parseRedisAddr(%q): got %v, want ErrInvalid", bad, err)
		}
	}
}
