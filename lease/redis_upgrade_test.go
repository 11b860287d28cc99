package lease

import (
	"strconv"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/redistest"
)

// TestRedisUpgradeFromSeparateKeys writes a key's bucket and share as the
// store before issue 12 left them (the hash "…:b" and the string "…:s"),
// then operates with this one: a grant reads both and moves the bucket into
// the key's one Redis key, leaving the share where it is (with a ShareTTL
// now, so that a share whose DeleteShares was lost ends); a share write
// moves the share and its escrow, and deletes the old key; DeleteShares
// deletes an old share.
func TestRedisUpgradeFromSeparateKeys(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	const shareTTL = time.Hour
	s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second, ShareTTL: shareTTL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	exists := func(name string) bool {
		t.Helper()
		n, err := client.Exists(ctx, name).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	l := slow(10, 1)
	// The old bucket's last update is an hour ahead of the server, so
	// nothing refills: 3 tokens, at share 500,000 (capacity 5), with 1.5
	// tokens credited in generation 7.
	last := time.Now().Add(time.Hour).UnixMicro()
	if err := client.HSet(ctx, s.oldBucketKey("k"), "tokens", "3", "last", strconv.FormatInt(last, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.PExpire(ctx, s.oldBucketKey("k"), 3*time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.Set(ctx, s.oldShareKey("k"), "500000:7:0:1500", 0).Err(); err != nil {
		t.Fatal(err)
	}
	h := &harness{store: s}

	g := grant1(t, h, "k", 2, l)
	if g.Granted != 2 || g.Tokens != 1 || g.Capacity != 5 {
		t.Errorf("first grant: got %+v, want 2 of the old bucket's 3 at the old share's capacity 5", g)
	}
	if exists(s.oldBucketKey("k")) {
		t.Errorf("the old bucket key is still there after a grant moved it")
	}
	st, _, ok := readRedisState(t, client, s, "k")
	if !ok || st.hasShare || st.last != last || st.tokens != 1 {
		t.Errorf("got state %+v exists %v, want the bucket (1 token, last %d) without the share", st, ok, last)
	}
	if ttl, err := client.PTTL(ctx, s.oldShareKey("k")).Result(); err != nil || ttl <= shareTTL-time.Minute || ttl > shareTTL {
		t.Errorf("old share key: got PTTL %v, %v; want about %v", ttl, err, shareTTL)
	}
	wantShare(t, h, "k", 500_000)

	// Generation 7 had credited 1.5 tokens: 2.5 received credits 1 more.
	out := make([]ShareResult, 1)
	if err := s.SetShares(ctx, []ShareUpdate{{Key: "k", SharePPM: 400_000, Limit: l, Gen: 7, Received: 2500}}, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Tokens != 2 || out[0].Released != 0 {
		t.Errorf("share write: got %+v, want 1 + 1 credited = 2 tokens, nothing released", out[0])
	}
	if exists(s.oldShareKey("k")) {
		t.Errorf("the old share key is still there after a share write moved it")
	}
	st, _, _ = readRedisState(t, client, s, "k")
	if !st.hasShare || st.share != 400_000 || st.gen != 7 || st.credited != 2500 {
		t.Errorf("got state %+v, want share 400000, generation 7, 2500 credited", st)
	}
	if err := s.SetShares(ctx, []ShareUpdate{{Key: "k", SharePPM: 400_000, Limit: l, Gen: 7, Received: 2500}}, out); err != nil || out[0].Tokens != 2 {
		t.Errorf("the same write again: got %+v, %v; want nothing credited twice", out[0], err)
	}

	// A share left by a lost DeleteShares: deleted now.
	if err := client.Set(ctx, s.oldShareKey("retired"), "250000", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wantShare(t, h, "retired", 250_000)
	if err := s.DeleteShares(ctx, []string{"retired"}); err != nil {
		t.Fatal(err)
	}
	if exists(s.oldShareKey("retired")) || exists(s.stateKey("retired")) {
		t.Errorf("DeleteShares left keys of %q", "retired")
	}
}
