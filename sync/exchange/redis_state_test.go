package exchange

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/redistest"
	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/sync/codec"
)

// redisCoordinatorFixture is a RedisCoordinator, its store and client, on
// a server shared with other tests (its own key prefix).
func redisCoordinatorFixture(t *testing.T) (*RedisCoordinator, *lease.RedisStore, redis.UniversalClient) {
	return redisCoordinatorFixtureWith(t, lease.RedisConfig{})
}

// redisCoordinatorFixtureWith is redisCoordinatorFixture with the store's
// cfg (its Prefix and Timeout set here).
func redisCoordinatorFixtureWith(t *testing.T, cfg lease.RedisConfig) (*RedisCoordinator, *lease.RedisStore, redis.UniversalClient) {
	t.Helper()
	client, err := lease.NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	cfg.Prefix, cfg.Timeout = redistest.KeyPrefix(t), time.Second
	s, err := lease.NewRedisStore(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return NewRedisCoordinator(s), s, client
}

// redisStateFixture is a RedisCoordinator on a server shared with other
// tests (its own key prefix), holding region "eu" for "a".
func redisStateFixture(t *testing.T) (*RedisCoordinator, redis.UniversalClient) {
	return redisStateFixtureWith(t, lease.RedisConfig{})
}

// redisStateFixtureWith is redisStateFixture with the store's cfg.
func redisStateFixtureWith(t *testing.T, cfg lease.RedisConfig) (*RedisCoordinator, redis.UniversalClient) {
	t.Helper()
	c, _, client := redisCoordinatorFixtureWith(t, cfg)
	if _, err := c.Acquire(context.Background(), "eu", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	return c, client
}

// records returns n records of keys named prefix0, prefix1, ....
func records(prefix string, n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[prefix+strconv.Itoa(i)] = fmt.Sprintf("record of %s%d", prefix, i)
	}
	return m
}

func savedOf(whole bool, head string, recs map[string]string, deleted ...string) SavedState {
	st := SavedState{Whole: whole, Head: []byte(head), Deleted: deleted}
	for k, r := range recs {
		st.Keys = append(st.Keys, k)
		st.Records = append(st.Records, []byte(r))
	}
	return st
}

// checkGroups checks the stored layout against want: the head's fields,
// g groups holding want's records, each a listpack of at most 128, and no
// other key of the region's state.
func checkGroups(t *testing.T, c *RedisCoordinator, client redis.UniversalClient, head string, want map[string]string, g int) {
	t.Helper()
	ctx := context.Background()
	meta, err := client.HGetAll(ctx, c.key("eu", "state")).Result()
	if err != nil {
		t.Fatal(err)
	}
	wantMeta := map[string]string{"": stateGrouped, "h": head, "g": strconv.Itoa(g), "n": strconv.Itoa(len(want))}
	if diff := cmp.Diff(wantMeta, meta); diff != "" {
		t.Fatalf("head (-want +got):\n%s", diff)
	}
	got := map[string]string{}
	for i := range g {
		key := c.key("eu", "state") + ":" + strconv.Itoa(i)
		recs, err := client.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if enc := client.ObjectEncoding(ctx, key).Val(); len(recs) > 0 && (enc != "listpack" || len(recs) > 128) {
			t.Errorf("group %d: %d records, encoded as %s", i, len(recs), enc)
		}
		long, err := client.HGetAll(ctx, key+":l").Result()
		if err != nil {
			t.Fatal(err)
		}
		for k, r := range long {
			if len(r) <= longRecord {
				t.Errorf("a record of %d bytes (%q) in group %d's long records", len(r), k, i)
			}
			if _, both := recs[k]; both {
				t.Errorf("%q in group %d and in its long records", k, i)
			}
		}
		for k, r := range recs {
			if len(r) > longRecord {
				t.Errorf("a record of %d bytes (%q) in group %d, not its long records", len(r), k, i)
			}
		}
		for k, r := range merge(recs, long) {
			if groupOf(k, g) != i {
				t.Errorf("record of %q in group %d, want %d", k, i, groupOf(k, g))
			}
			got[k] = r
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("records (-want +got):\n%s", diff)
	}
	keys, err := client.Keys(ctx, c.key("eu", "state")+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if nonEmpty := len(keys) - 1; nonEmpty > 2*g {
		t.Errorf("%d keys of groups and their long records, want at most %d: the old groups were not deleted", nonEmpty, 2*g)
	}
	st, loaded := loadRecords(t, c)
	if string(st.Head) != head || !cmp.Equal(want, loaded) {
		t.Fatalf("Load: head %q and %d records, want %q and %d", st.Head, len(loaded), head, len(want))
	}
}

// merge returns a map of a's entries and b's.
func merge(a, b map[string]string) map[string]string {
	m := maps.Clone(a)
	maps.Copy(m, b)
	return m
}

// loadRecords loads region eu's state and its records by key.
func loadRecords(t *testing.T, c *RedisCoordinator) (SavedState, map[string]string) {
	t.Helper()
	st, err := c.Load(context.Background(), "eu")
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string]string, len(st.Keys))
	for i, k := range st.Keys {
		m[k] = string(st.Records[i])
	}
	return st, m
}

// TestRedisStateGroups checks the layout of the state: records in groups
// of listpacks, a partial save changing records in place, and the groups
// chosen again (the old ones deleted) when the records outgrow them or
// shrink well below them.
func TestRedisStateGroups(t *testing.T) {
	c, client := redisStateFixture(t)
	ctx := context.Background()
	want := records("k", 500)
	if err := c.Save(ctx, "eu", "a", savedOf(true, "h1", want)); err != nil {
		t.Fatal(err)
	}
	checkGroups(t, c, client, "h1", want, 11)

	// A fresh coordinator (another replica that took over) knows no
	// groups: it reads them before a partial save.
	s2, err := lease.NewRedisStore(client, lease.RedisConfig{Prefix: c.prefix, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c2 := NewRedisCoordinator(s2)
	change := map[string]string{"k1": "changed", "new": "a new key"}
	if err := c2.Save(ctx, "eu", "a", savedOf(false, "h2", change, "k2", "k3", "absent")); err != nil {
		t.Fatal(err)
	}
	maps.Copy(want, change)
	delete(want, "k2")
	delete(want, "k3")
	checkGroups(t, c, client, "h2", want, 11)

	// 1,000 more records: 1,500 in 11 groups is above 80 a group.
	more := records("m", 1000)
	if err := c.Save(ctx, "eu", "a", savedOf(false, "h3", more)); err != nil {
		t.Fatal(err)
	}
	maps.Copy(want, more)
	checkGroups(t, c, client, "h3", want, groupsFor(len(want)))

	deleteDownTo(t, c, want, 100, "h4") // below 16 a group
	checkGroups(t, c, client, "h4", want, groupsFor(100))

	// Another holder writes nothing.
	if err := c.Save(ctx, "eu", "b", savedOf(true, "hb", records("b", 3))); err == nil {
		t.Fatal("a save by a replica not holding the election succeeded")
	}
	checkGroups(t, c, client, "h4", want, groupsFor(100))
}

// TestRedisStateGroupsFloor checks that with the store's grouped layout the
// state keeps at least the store's groups: no regrouping while the records
// grow up to about 80 a group of them, nor as they shrink, and one past it.
func TestRedisStateGroupsFloor(t *testing.T) {
	c, client := redisStateFixtureWith(t, lease.RedisConfig{Layout: lease.LayoutGroups, Groups: 64})
	ctx := context.Background()
	want := records("k", 500)
	if err := c.Save(ctx, "eu", "a", savedOf(true, "h1", want)); err != nil {
		t.Fatal(err)
	}
	checkGroups(t, c, client, "h1", want, 64)

	more := records("m", 4000) // 4,500 in 64 groups: 70 a group
	if err := c.Save(ctx, "eu", "a", savedOf(false, "h2", more)); err != nil {
		t.Fatal(err)
	}
	maps.Copy(want, more)
	checkGroups(t, c, client, "h2", want, 64)

	deleteDownTo(t, c, want, 100, "h3") // under 16 a group: kept
	checkGroups(t, c, client, "h3", want, 64)

	more = records("n", 5100) // 5,200: over 80 a group
	if err := c.Save(ctx, "eu", "a", savedOf(false, "h4", more)); err != nil {
		t.Fatal(err)
	}
	maps.Copy(want, more)
	checkGroups(t, c, client, "h4", want, groupsFor(len(want)))
}

// TestRedisStateLongRecords checks that records longer than a listpack's
// values are kept in their group's long records, that a record moves
// between the two as its length crosses longRecord, that deletes reach
// both, and that the groups stay listpacks and a regrouping leaves no
// long records behind.
func TestRedisStateLongRecords(t *testing.T) {
	c, client := redisStateFixture(t)
	ctx := context.Background()
	long := func(k string) string { return strings.Repeat("L", longRecord+1) + k }
	want := records("k", 200)
	for i := 0; i < 200; i += 7 {
		want["k"+strconv.Itoa(i)] = long("k" + strconv.Itoa(i))
	}
	if err := c.Save(ctx, "eu", "a", savedOf(true, "h1", want)); err != nil {
		t.Fatal(err)
	}
	checkGroups(t, c, client, "h1", want, groupsFor(200))

	// k0 shortens, k1 lengthens, k7 (long) and k2 (short) are deleted.
	change := map[string]string{"k0": "short again", "k1": long("k1"), "new": long("new")}
	if err := c.Save(ctx, "eu", "a", savedOf(false, "h2", change, "k7", "k2")); err != nil {
		t.Fatal(err)
	}
	maps.Copy(want, change)
	delete(want, "k7")
	delete(want, "k2")
	checkGroups(t, c, client, "h2", want, groupsFor(200))

	// 2,000 more, long: regrouped, the old groups' long records deleted.
	more := records("m", 2000)
	for k := range more {
		more[k] = long(k)
	}
	if err := c.Save(ctx, "eu", "a", savedOf(false, "h3", more)); err != nil {
		t.Fatal(err)
	}
	maps.Copy(want, more)
	checkGroups(t, c, client, "h3", want, groupsFor(len(want)))

	// The layout before long records were apart (head "\x00grouped", no
	// ":l" hashes) is read, and a partial save over it keeps its groups.
	head := c.key("eu", "state")
	old := records("o", 100)
	if err := client.Del(ctx, head).Err(); err != nil {
		t.Fatal(err)
	}
	keys, err := client.Keys(ctx, head+":*").Result()
	if err != nil || client.Del(ctx, keys...).Err() != nil {
		t.Fatal(keys, err)
	}
	for k, r := range old {
		client.HSet(ctx, head+":"+strconv.Itoa(groupOf(k, 2)), k, r)
	}
	client.HSet(ctx, head, "", stateGroupedShort, "h", "old", "g", 2, "n", len(old))
	c.mu.Lock()
	delete(c.groups, "eu")
	c.mu.Unlock()
	if _, got := loadRecords(t, c); !cmp.Equal(old, got) {
		t.Fatalf("the layout before: loaded %d records, want %d", len(got), len(old))
	}
	if err := c.Save(ctx, "eu", "a", savedOf(false, "h4", map[string]string{"o1": long("o1")}, "o2")); err != nil {
		t.Fatal(err)
	}
	old["o1"] = long("o1")
	delete(old, "o2")
	checkGroups(t, c, client, "h4", old, 2)
}

// TestRedisStateUpgrade checks that the state as the release before groups
// kept it (one hash, the head at field "", records beside it) is read, that
// a partial save over it is refused, and that a whole save replaces it with
// a head that release cannot read (so it does not take the exchange over).
func TestRedisStateUpgrade(t *testing.T) {
	c, client := redisStateFixture(t)
	ctx := context.Background()
	old := records("k", 300)
	args := []any{"", "old head"}
	for k, r := range old {
		args = append(args, k, r)
	}
	if err := client.HSet(ctx, c.key("eu", "state"), args...).Err(); err != nil {
		t.Fatal(err)
	}
	st, loaded := loadRecords(t, c)
	if string(st.Head) != "old head" || !cmp.Equal(old, loaded) {
		t.Fatalf("Load of the one hash: head %q and %d records, want %q and %d", st.Head, len(loaded), "old head", len(old))
	}
	if err := c.Save(ctx, "eu", "a", savedOf(false, "h", nil, "k1")); !errors.Is(err, ErrNoWholeState) {
		t.Fatalf("a partial save over the one hash: got %v, want ErrNoWholeState", err)
	}
	if err := c.Save(ctx, "eu", "a", savedOf(true, "h", old)); err != nil {
		t.Fatal(err)
	}
	checkGroups(t, c, client, "h", old, groupsFor(len(old)))
	// What that release reads as the head: not a snapshot.
	head, err := client.HGet(ctx, c.key("eu", "state"), "").Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := codec.JoinSnapshot(head, nil, nil); err == nil {
		t.Fatalf("the release before groups would read head %q as a snapshot", head)
	}
}

// TestRedisStateOnCluster saves and loads the state on a Redis Cluster:
// the script writes groups it names itself, in the head's slot by the
// region's hash tag.
func TestRedisStateOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cluster := redistest.StartCluster(t, 3)
	client, err := lease.NewRedisClient(cluster.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s, err := lease.NewRedisStore(client, lease.RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := NewRedisCoordinator(s)
	ctx := context.Background()
	if _, err := c.Acquire(ctx, "eu", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	want := records("k", 200)
	if err := c.Save(ctx, "eu", "a", savedOf(true, "h1", want)); err != nil {
		t.Fatal(err)
	}
	change := records("m", 600) // regroups
	if err := c.Save(ctx, "eu", "a", savedOf(false, "h2", change, "k1")); err != nil {
		t.Fatal(err)
	}
	maps.Copy(want, change)
	delete(want, "k1")
	st, got := loadRecords(t, c)
	if string(st.Head) != "h2" || !cmp.Equal(want, got) {
		t.Fatalf("Load: head %q and %d records, want %q and %d", st.Head, len(got), "h2", len(want))
	}
}

// deleteDownTo deletes records of want in a partial save with head until n
// are left, from the store and from want.
func deleteDownTo(t *testing.T, c *RedisCoordinator, want map[string]string, n int, head string) {
	t.Helper()
	var gone []string
	for k := range want {
		if len(want)-len(gone) > n {
			gone = append(gone, k)
		}
	}
	if err := c.Save(context.Background(), "eu", "a", savedOf(false, head, nil, gone...)); err != nil {
		t.Fatal(err)
	}
	for _, k := range gone {
		delete(want, k)
	}
}
