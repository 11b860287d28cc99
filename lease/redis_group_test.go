package lease

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/region"
)

// TestSlotTags: the hash function is Redis Cluster's, and every slot has a
// short alphanumeric tag in it.
func TestSlotTags(t *testing.T) {
	// CRC-16/XMODEM's check value, and Redis Cluster's own examples.
	if got := crc16("123456789"); got != 0x31c3 {
		t.Errorf("crc16 check: got %#x, want 0x31c3", got)
	}
	if got := crc16("foo") % clusterSlots; got != 12182 {
		t.Errorf("slot of foo: got %d, want 12182 (CLUSTER KEYSLOT foo)", got)
	}
	for s := range clusterSlots {
		tag := slotTag(s)
		if int(crc16(tag))%clusterSlots != s || len(tag) == 0 || len(tag) > 3 {
			t.Fatalf("slot %d: tag %q is in slot %d", s, tag, crc16(tag)%clusterSlots)
		}
		for _, c := range tag {
			if !('0' <= c && c <= '9' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z') {
				t.Fatalf("slot %d: tag %q is not alphanumeric", s, tag)
			}
		}
	}
}

// layoutStores are two stores on one Redis and prefix, one per layout, as
// the replicas of a region are while it switches layouts.
func layoutStores(t *testing.T, client redis.UniversalClient, groups int) (keys, grouped *RedisStore) {
	t.Helper()
	cfg := RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second, ShareTTL: time.Hour, Groups: groups}
	keys, err := NewRedisStore(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Layout = LayoutGroups
	grouped, err = NewRedisStore(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return keys, grouped
}

func TestRedisLayoutSwitch(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	testLayoutSwitch(t, client, 4)
}

// testLayoutSwitch: replicas running different layouts on one Redis (a
// region switching layouts, one replica at a time) share each key's one
// bucket: each reads the state where the other left it and moves it to
// its own place, so it is never in both and no token is granted twice;
// shares and escrow move with it.
func testLayoutSwitch(t *testing.T, client redis.UniversalClient, groups int) {
	keys, grouped := layoutStores(t, client, groups)
	ctx := t.Context()
	in := func(key string) (own, group bool) {
		t.Helper()
		n, err := client.Exists(ctx, keys.stateKey(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		g, err := client.HExists(ctx, keys.groupKey(key), groupField(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1, g
	}
	l := slow(10, 1)
	var total int64
	for i := range 12 {
		s, want := keys, LayoutKeys
		if i%2 == 1 || i > 8 {
			s, want = grouped, LayoutGroups
		}
		total += grant1(t, &harness{store: s}, "k", 1, l).Granted
		if own, group := in("k"); own != (want == LayoutKeys) || group != (want == LayoutGroups) {
			t.Fatalf("grant %d by the %v store: state in own key %v, in group %v; want only in the %v place", i, want, own, group, want)
		}
	}
	if total != 10 {
		t.Errorf("granted %d in 12 grants of 1 from a bucket of 10 across layouts, want 10", total)
	}

	// A share with escrow written by one layout is read and credited once
	// by the other.
	up := []ShareUpdate{{Key: "s", SharePPM: 500_000, Limit: l, Gen: 3, Received: 2_000}}
	out := make([]ShareResult, 1)
	if err := grouped.SetShares(ctx, up, out); err != nil {
		t.Fatal(err)
	}
	before := out[0].Tokens
	if err := keys.SetShares(ctx, up, out); err != nil || out[0].Tokens != before {
		t.Errorf("the same share write by the other layout: got %+v, %v; want %v tokens (nothing credited twice)", out[0], err, before)
	}
	for _, s := range []*RedisStore{keys, grouped} {
		wantShare(t, &harness{store: s}, "s", 500_000)
		if st, ok, err := s.Peek(ctx, "s", l); err != nil || !ok || st.SharePPM != 500_000 || st.Gen != 3 || st.Credited != 2_000 {
			t.Errorf("Peek by the %v store: got %+v, %v, %v; want share 500000, generation 3, 2000 credited", s.cfg.Layout, st, ok, err)
		}
	}
	if g := grant1(t, &harness{store: grouped}, "s", 100, l); g.Capacity != 5 {
		t.Errorf("grant at the share written by the other layout: got %+v, want capacity 5", g)
	}
	if err := keys.DeleteShares(ctx, []string{"s"}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*RedisStore{keys, grouped} {
		wantShare(t, &harness{store: s}, "s", -1)
	}
}

// TestRedisGroupSweep: stale fields of a live group go as it is written:
// each write checks three fields at random. 99 expired fields beside one
// hot key are gone within a few hundred writes (about 40 expected: each
// write finds three while most of the group is stale).
func TestRedisGroupSweep(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second, Layout: LayoutGroups, Groups: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	g := s.groupKey("hot")
	past := redisNow(t, client).Add(-time.Second).UnixMilli()
	stale := groupValue(past, redisState{tokens: 1, last: past * 1000}.encode())
	for i := range 99 {
		if err := client.HSet(ctx, g, "gone"+string(rune('A'+i%26))+string(rune('a'+i/26)), stale).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The expiry the script would have given the group, had it written
	// the fields.
	if err := client.PExpire(ctx, g, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	h := &harness{store: s}
	l := Limit{Rate: 1000, Burst: 1e6, Cost: 1, InitialShare: region.PPM} // expires 2000 s after a grant
	writes := 0
	for ; writes < 300; writes++ {
		if n, err := client.HLen(ctx, g).Result(); err != nil {
			t.Fatal(err)
		} else if n == 1 && writes > 0 {
			break
		}
		grant1(t, h, "hot", 1, l)
	}
	if n, _ := client.HLen(ctx, g).Result(); n != 1 {
		t.Fatalf("after %d writes the group holds %d fields, want the hot key's alone", writes, n)
	}
	t.Logf("99 stale fields gone after %d writes", writes)
	if ttl, err := client.PTTL(ctx, g).Result(); err != nil || ttl <= 0 {
		t.Errorf("the group's PTTL: got %v, %v; want an expiry", ttl, err)
	}
}

// TestRedisGroupExpiry: a group expires no sooner than its latest field,
// never while a field never expires, and gets its expiry back when that
// field changes.
func TestRedisGroupExpiry(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second, Layout: LayoutGroups, Groups: 1, ShareTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	g := s.groupKey("a")
	pttl := func() time.Duration {
		t.Helper()
		d, err := client.PTTL(ctx, g).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	h := &harness{store: s}
	wantGranted(t, grant1(t, h, "a", 1, slow(10, 1)), 1)                            // full again in 1000 s; expires in 2000 s
	if d := pttl(); d < 1990*time.Second || d > 2000*time.Second+time.Millisecond { // rounded up to whole ms
		t.Errorf("after a grant: group PTTL %v, want the field's 2000 s", d)
	}
	wantGranted(t, grant1(t, h, "b", 1, fast), 1) // a field expiring sooner leaves it
	if d := pttl(); d < 1990*time.Second {
		t.Errorf("after a shorter field: group PTTL %v, want still about 2000 s", d)
	}
	setShare(t, h, "b", 0, fast) // never refills, never expires
	if d := pttl(); d != -1 {
		t.Errorf("with a field that never expires: group PTTL %v, want none (-1ns)", d)
	}
	wantGranted(t, grant1(t, h, "c", 1, fast), 1)
	if d := pttl(); d != -1 {
		t.Errorf("a field written beside one that never expires: group PTTL %v, want none", d)
	}
	setShare(t, h, "b", 500_000, fast) // lives ShareTTL now
	if d := pttl(); d < 59*time.Minute || d > time.Hour+time.Millisecond {
		t.Errorf("after the field that never expired got one: group PTTL %v, want the latest field's, 1h", d)
	}
	if err := s.DeleteShares(ctx, []string{"b"}); err != nil {
		t.Fatal(err)
	}
	if d := pttl(); d <= 0 {
		t.Errorf("group PTTL %v after DeleteShares, want an expiry", d)
	}
}

// TestRedisGroupsUpgradeFromSeparateKeys: LayoutGroups reads the bucket and
// share of before issue 12 and moves both into the key's field on its
// first write, the share with the expiry it had (a ShareTTL if none).
func TestRedisGroupsUpgradeFromSeparateKeys(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	const shareTTL = time.Hour
	s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second, ShareTTL: shareTTL, Layout: LayoutGroups, Groups: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	last := time.Now().Add(time.Hour).UnixMicro() // nothing refills
	if err := client.HSet(ctx, s.oldBucketKey("k"), "tokens", "3", "last", last).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.Set(ctx, s.oldShareKey("k"), "500000:7:0:1500", 0).Err(); err != nil {
		t.Fatal(err)
	}
	h := &harness{store: s}
	wantShare(t, h, "k", 500_000)
	g := grant1(t, h, "k", 2, slow(10, 1))
	if g.Granted != 2 || g.Tokens != 1 || g.Capacity != 5 {
		t.Errorf("first grant: got %+v, want 2 of the old bucket's 3 at the old share's capacity 5", g)
	}
	for _, name := range []string{s.oldBucketKey("k"), s.oldShareKey("k")} {
		if n, err := client.Exists(ctx, name).Result(); err != nil || n != 0 {
			t.Errorf("%s: exists %d, %v after the grant moved it; want gone", name, n, err)
		}
	}
	st, exp, ok := readRedisState(t, client, s, "k")
	nowMS := redisNow(t, client).UnixMilli()
	if !ok || !st.hasShare || st.share != 500_000 || st.gen != 7 || st.credited != 1500 || st.last != last || exp < nowMS+shareTTL.Milliseconds()-60_000 {
		t.Errorf("got state %+v expiring at %d (now %d), want the bucket and share 500000 (generation 7, 1500 credited) for a ShareTTL", st, exp, nowMS)
	}
	if err := s.SetShares(ctx, []ShareUpdate{{Key: "k", SharePPM: 400_000, Limit: slow(10, 1), Gen: 7, Received: 1500}}, nil); err != nil {
		t.Fatal(err)
	}
	wantShare(t, h, "k", 400_000)
}

// TestRedisGroupsLongKeys: keys longer than a field's 40 bytes are hashed
// into one, and stay apart.
func TestRedisGroupsLongKeys(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second, Layout: LayoutGroups, Groups: 1})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{store: s}
	long := "per-api-key/key=0123456789abcdef0123456789abcdef0123456789abcdef"
	wantGranted(t, grant1(t, h, long+"0", 4, slow(10, 1)), 4)
	wantGranted(t, grant1(t, h, long+"1", 10, slow(10, 1)), 10)
	if g := grant1(t, h, long+"0", 10, slow(10, 1)); g.Granted != 6 {
		t.Errorf("got %+v, want the 6 left of the first long key", g)
	}
	enc, err := client.Do(t.Context(), "OBJECT", "ENCODING", s.groupKey(long)).Text()
	if err != nil || enc != "listpack" {
		t.Errorf("group encoding: got %q, %v; want listpack", enc, err)
	}
}
