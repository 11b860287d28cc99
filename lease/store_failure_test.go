package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/redistest"
)

// failureSlack is how far past RedisConfig.Timeout a failing call may
// return: scheduling on a loaded 2-core machine, not a retry budget.
const failureSlack = 50 * time.Millisecond

// TestRedisStoreUnavailable stops and pauses a real redis-server under a
// store and checks that every call fails with ErrUnavailable within the
// configured timeout, and that the store serves again once Redis is back.
func TestRedisStoreUnavailable(t *testing.T) {
	srv := redistest.StartServer(t)
	client, err := NewRedisClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	const timeout = 50 * time.Millisecond
	s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	l := slow(10, 1)
	reqs := []GrantRequest{{Key: "a", Want: 4, Limit: l}, {Key: "b", Want: 4, Limit: l}}
	out := make([]Grant, len(reqs))
	if err := s.Grant(t.Context(), reqs, out); err != nil {
		t.Fatalf("Grant with Redis up: %v", err)
	}
	incarnation := func() string {
		t.Helper()
		inc, err := s.Incarnation(t.Context())
		if err != nil || inc == "" {
			t.Fatalf("Incarnation with Redis up: got %q, %v; want a run_id", inc, err)
		}
		return inc
	}
	inc0 := incarnation()
	if again := incarnation(); again != inc0 {
		t.Errorf("Incarnation changed with nothing restarted: %q, then %q", inc0, again)
	}

	// Each call must fail fast and say why.
	checkDown := func(how string) {
		t.Helper()
		calls := map[string]func(ctx context.Context) error{
			"Grant": func(ctx context.Context) error { return s.Grant(ctx, reqs, out) },
			"Return": func(ctx context.Context) error {
				return s.Return(ctx, []ReturnRequest{{Key: "a", Tokens: 1, Limit: l}})
			},
			"SetShares": func(ctx context.Context) error {
				return s.SetShares(ctx, []ShareUpdate{{Key: "a", SharePPM: 5, Limit: l}}, nil)
			},
			"Shares": func(ctx context.Context) error { return s.Shares(ctx, []string{"a"}, make([]int64, 1)) },
			"Ping":   func(ctx context.Context) error { return s.Ping(ctx) },
			"Incarnation": func(ctx context.Context) error {
				_, err := s.Incarnation(ctx)
				return err
			},
		}
		for name, call := range calls {
			start := time.Now()
			err := call(t.Context())
			took := time.Since(start)
			if !errors.Is(err, ErrUnavailable) {
				t.Errorf("%s with Redis %s: got %v, want ErrUnavailable", name, how, err)
			}
			if took > timeout+failureSlack {
				t.Errorf("%s with Redis %s: returned after %v, want ≤ %v + %v", name, how, took, timeout, failureSlack)
			}
			t.Logf("%s with Redis %s: %v after %v", name, how, err, took)
		}
	}
	backUp := func() {
		t.Helper()
		deadline := time.Now().Add(pollDeadline)
		for s.Grant(t.Context(), reqs, out) != nil {
			if time.Now().After(deadline) {
				t.Fatalf("Grant still failing %v after Redis came back", pollDeadline)
			}
			time.Sleep(5 * time.Millisecond) // poll interval while the client reconnects
		}
	}

	srv.Stop()
	checkDown("stopped")
	srv.Restart()
	backUp()
	// The restarted server lost everything (no persistence): buckets start
	// full, and the script was reloaded after NOSCRIPT.
	if out[0].Granted != 4 || out[0].Tokens != 6 {
		t.Errorf("after restart: got %+v, want 4 granted from a fresh bucket", out[0])
	}
	// It lost every write: a new incarnation, so the exchange rewrites.
	inc1 := incarnation()
	if inc1 == inc0 {
		t.Errorf("Incarnation after a restart: got %q, the same as before; want a new one", inc1)
	}

	srv.Pause() // a hung server: connections open, nothing answered
	checkDown("paused")
	// The exchange's calls have its budget when they carry a deadline: a
	// batch of hundreds of share writes is not a lease.
	for name, call := range map[string]func(ctx context.Context) error{
		"SetShares": func(ctx context.Context) error {
			return s.SetShares(ctx, []ShareUpdate{{Key: "a", SharePPM: 5, Limit: l}}, nil)
		},
		"DeleteShares": func(ctx context.Context) error { return s.DeleteShares(ctx, []string{"a"}) },
	} {
		const budget = 6 * timeout
		ctx, cancel := context.WithTimeout(t.Context(), budget)
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, ErrUnavailable) || took < budget-timeout || took > budget+failureSlack {
			t.Errorf("%s with a %v deadline, Redis paused: %v after %v; want ErrUnavailable after about the deadline, not Timeout (%v)", name, budget, err, took, timeout)
		}
	}
	srv.Resume()
	backUp()
	if got := incarnation(); got != inc1 {
		t.Errorf("Incarnation after a pause: got %q, want %q (nothing was lost)", got, inc1)
	}
}

// TestRedisStoreScriptFlushed: a server that forgot the script (SCRIPT
// FLUSH, a failover to a replica that never loaded it) still serves, via
// EVAL, in the same call.
func TestRedisStoreScriptFlushed(t *testing.T) {
	srv := redistest.StartServer(t) // its own server: flushing scripts is not polite on a shared one
	client, err := NewRedisClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s, err := NewRedisStore(client, RedisConfig{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := slow(10, 1)
	for i := range 3 {
		if err := client.ScriptFlush(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		g := grant1(t, &harness{store: s}, "k", 3, l)
		wantGranted(t, g, 3)
		// slowRate refills a few hundred-thousandths of a token meanwhile.
		if want := float64(10 - 3*(i+1)); g.Tokens < want || g.Tokens > want+0.01 {
			t.Errorf("round %d: got %v tokens, want %v (+ < 0.01 refill)", i, g.Tokens, want)
		}
	}
}

// TestRedisStoreForeignShare: a share that this code did not write is an
// error (not ErrUnavailable, not a grant at an unknown rate), and nothing
// is debited, in either layout.
func TestRedisStoreForeignShare(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	for _, layout := range []RedisLayout{LayoutKeys, LayoutGroups} {
		t.Run(layout.String(), func(t *testing.T) {
			s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: time.Second, Layout: layout})
			if err != nil {
				t.Fatal(err)
			}
			foreignShare(t, s)
		})
	}
}

func foreignShare(t *testing.T, s *RedisStore) {
	client, ctx := s.client, t.Context()
	l := slow(10, 1)
	for _, v := range []string{"abc", "-1", "1000001", "0.5"} {
		if err := client.Set(ctx, s.oldShareKey("k"), v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		err := s.Grant(ctx, []GrantRequest{{Key: "k", Want: 1, Limit: l}}, make([]Grant, 1))
		if err == nil || errors.Is(err, ErrUnavailable) {
			t.Errorf("share %q: got %v, want a non-ErrUnavailable error", v, err)
		}
		if err := s.Shares(ctx, []string{"k"}, make([]int64, 1)); (v == "abc" || v == "0.5") && err == nil {
			t.Errorf("Shares of %q: got no error", v)
		}
	}
	if _, _, ok := readRedisState(t, client, s, "k"); ok {
		t.Errorf("got a state written, want none")
	}
	// A state this code did not write is refused the same way.
	if err := client.Del(ctx, s.oldShareKey("k")).Err(); err != nil {
		t.Fatal(err)
	}
	name, set, get := s.stateKey("k"), client.Set, client.Get
	if s.cfg.Layout == LayoutGroups {
		g := s.groupKey("k")
		name = g
		set = func(ctx context.Context, _ string, v any, _ time.Duration) *redis.StatusCmd {
			return redis.NewStatusResult("", client.HSet(ctx, g, "k", v).Err())
		}
		get = func(ctx context.Context, _ string) *redis.StringCmd { return client.HGet(ctx, g, "k") }
	}
	tooBig := redisState{tokens: 1, last: 1, hasShare: true, share: 2_000_000}.encode()
	future := time.Now().Add(time.Hour).UnixMilli()
	values := []string{"abc", "0123456789abcdef", tooBig, redisState{tokens: 1, last: 1}.encode() + "x"}
	if s.cfg.Layout == LayoutGroups {
		values = append(values, groupValue(future, "abc"), groupValue(future, tooBig), groupValue(0, "0123456789ab"))
	}
	for _, v := range values {
		if err := set(ctx, name, v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		err := s.Grant(ctx, []GrantRequest{{Key: "k", Want: 1, Limit: l}}, make([]Grant, 1))
		if err == nil || errors.Is(err, ErrUnavailable) {
			t.Errorf("state %q: got %v, want a non-ErrUnavailable error", v, err)
		}
		if got, err := get(ctx, name).Result(); err != nil || got != v {
			t.Errorf("state %q: got %q, %v after the refused grant, want it unchanged", v, got, err)
		}
	}
}
