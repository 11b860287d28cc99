package exchange

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/region"
)

// RedisCoordinator keeps a region's persisted exchange state in small
// hashes, so that Redis keeps them listpack-encoded (about 60 B a key
// instead of about 230 in one large hash; docs/DESIGN.md, "Replicas of one
// region"):
//
//	<prefix>exchange:{<region>}:state     the head: a hash of fields
//	    ""   stateGrouped (not a snapshot: a release before this layout
//	         cannot read it, and does not take the exchange over)
//	    "h"  the snapshot's head (codec.EncodeSnapshotParts)
//	    "g"  G, the number of groups
//	    "n"  the number of records
//	<prefix>exchange:{<region>}:state:<i>  group i < G: a hash of the
//	    records of the keys whose FNV-1a hash is i modulo G, by key
//	<prefix>exchange:{<region>}:state:<i>:l  the group's records longer
//	    than longRecord bytes
//
// A record longer than Redis's hash-max-listpack-value (64 B by default)
// would turn its whole group into a hash table for good, at about twice
// the bytes a record (a key's record grows while its share moves); so long
// records are kept apart, in their group's ":l" hash, and a record moves
// between the two as its length crosses longRecord.
//
// Every key has the region's hash tag, so one script writes them all on a
// Redis Cluster. A whole save chooses G for about recordsPerGroup records a
// group (at least RedisCoordinator.minGroups) and deletes the groups of the
// state it replaces; a partial one keeps G, and when its records leave the
// range G suits the coordinator reads the state back and saves it whole
// with a new G. That regrouping reads and writes every record in one
// epoch: 1.4 s at 209,000 records and 3.2 s at 350,000 on the 2-core
// development machine, past the hold's three periods, so a region growing
// through it stepped down and wrote every share again. minGroups, from
// the store's grouped layout sized for the keys expected, spares a
// deployment growing to that size every regrouping. Releases before
// kept the head at field "" of the state hash and every record beside it,
// and before that the whole state as a string there: Load reads both, and
// the first whole save replaces them.

// stateGrouped is the head hash's field "" in this layout (saveScript
// writes it as '\0grouped2'). stateGroupedShort is the layout before long
// records were kept apart, read and written over (its groups have no ":l"
// hashes); a release that knows only it reads this one as no state and
// does not take the exchange over.
const (
	stateGrouped      = "\x00grouped2"
	stateGroupedShort = "\x00grouped"
)

// longRecord is the longest record kept in its group's listpack: Redis's
// default hash-max-listpack-value.
const longRecord = 64

// The group count: recordsPerGroup records a group on average when chosen;
// chosen again when the average leaves [minPerGroup, maxPerGroup]. Hashes
// of up to 128 fields of up to 64 bytes (hash-max-listpack-entries and
// -value, by default) are listpacks; at an average of 80 the fullest of
// thousands of groups holds about 115.
const (
	recordsPerGroup = 48
	maxPerGroup     = 80
	minPerGroup     = 16
)

// groupsFor is the group count for n records.
func groupsFor(n int) int { return max(1, (n+recordsPerGroup-1)/recordsPerGroup) }

// wholeGroups is the group count a whole save of n records chooses: at
// least c.minGroups.
func (c *RedisCoordinator) wholeGroups(n int) int { return max(c.minGroups, groupsFor(n)) }

// groupOf is key's group of g.
func groupOf(key string, g int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(g))
}

// saveScript writes the state only while holder holds the election:
// {1, records} then, {0, 0} otherwise, {-1, 0} for a partial state where no
// whole one of ARGV[4] groups is stored. KEYS[1] hold, KEYS[2] head;
// ARGV[1] holder, ARGV[2] "1" for a whole state, ARGV[3] the snapshot's
// head, ARGV[4] G, ARGV[5] the groups' key prefix (the head's key and ":"),
// ARGV[6] the number of groups records are deleted from, then for each the
// group, a count c and c keys; then until the end, for each group written,
// the group, counts s and l, s (key, record) pairs of records of at most
// longRecord bytes and l of longer ones. The groups' keys are made
// here: they share the head's hash tag, so its slot.
var saveScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, 0}
end
local g, prefix = tonumber(ARGV[4]), ARGV[5]
local typ = redis.call('TYPE', KEYS[2]).ok
local meta = {false, false, false}
if typ == 'hash' then
  meta = redis.call('HMGET', KEYS[2], '', 'g', 'n')
end
local grouped = meta[1] == '\0grouped2' or meta[1] == '\0grouped'
local n = 0
if ARGV[2] == '1' then
  if grouped then
    -- The old groups and their long records (up to the larger count, so
    -- that none is left to be read back as the new groups' own).
    local old = math.max(tonumber(meta[2]), g)
    local i = 0
    while i < old do
      local names = {}
      for j = i, math.min(i + 499, old - 1) do
        names[#names + 1] = prefix .. j
        names[#names + 1] = prefix .. j .. ':l'
      end
      redis.call('DEL', unpack(names))
      i = i + 500
    end
  end
  redis.call('DEL', KEYS[2])
elseif not grouped or tonumber(meta[2]) ~= g then
  return {-1, 0}
else
  n = tonumber(meta[3])
end
-- hdel deletes ARGV[i..last] from key if it exists, and returns how many.
local function hdel(key, i, last)
  local d = 0
  if redis.call('EXISTS', key) == 1 then
    while i <= last do
      local j = math.min(i + 999, last)
      d = d + redis.call('HDEL', key, unpack(ARGV, i, j))
      i = j + 1
    end
  end
  return d
end
-- hset sets the c (key, record) pairs from ARGV[i] in key, deletes their
-- keys from other, and returns the records added less those deleted.
local function hset(key, other, i, c)
  local last, d = i + 2 * c - 1, 0
  if c > 0 and redis.call('EXISTS', other) == 1 then
    for k = i, last, 2 do
      d = d + redis.call('HDEL', other, ARGV[k])
    end
  end
  while i <= last do
    local j = math.min(i + 1999, last)
    d = d - redis.call('HSET', key, unpack(ARGV, i, j))
    i = j + 1
  end
  return -d
end
local i = 7
for _ = 1, tonumber(ARGV[6]) do
  local key, last = prefix .. ARGV[i], i + 1 + tonumber(ARGV[i + 1])
  n = n - hdel(key, i + 2, last) - hdel(key .. ':l', i + 2, last)
  i = last + 1
end
while i <= #ARGV do
  local key, short, long = prefix .. ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  i = i + 3
  n = n + hset(key, key .. ':l', i, short)
  i = i + 2 * short
  n = n + hset(key .. ':l', key, i, long)
  i = i + 2 * long
end
redis.call('HSET', KEYS[2], '', '\0grouped2', 'h', ARGV[3], 'g', g, 'n', n)
return {1, n}
`)

// Save stores st as reg's exchange state, atomically with a check that
// holder holds the election; otherwise it returns an error wrapping
// region.ErrNotHolder and writes nothing. A whole state may be megabytes,
// so the call is bounded by ctx only.
func (c *RedisCoordinator) Save(ctx context.Context, reg, holder string, st SavedState) error {
	if err := checkSave(reg, holder, &st); err != nil {
		return err
	}
	g := 0
	if st.Whole {
		g = c.wholeGroups(len(st.Keys))
	} else {
		var err error
		if g, err = c.storedGroups(ctx, reg); err != nil {
			return err
		}
		if g == 0 {
			return fmt.Errorf("%w: region %q", ErrNoWholeState, reg)
		}
	}
	n, err := c.save(ctx, reg, holder, &st, g)
	if err != nil || st.Whole || (n <= maxPerGroup*g && (g <= c.minGroups || n >= minPerGroup*g)) {
		return err
	}
	// The records outgrew G (or shrank well below it): save them whole
	// again, in groups of recordsPerGroup.
	all, err := c.Load(ctx, reg)
	if err != nil {
		return fmt.Errorf("exchange: regrouping %d records of %d groups: %w", n, g, err)
	}
	all.Whole = true
	if _, err := c.save(ctx, reg, holder, &all, c.wholeGroups(len(all.Keys))); err != nil {
		return fmt.Errorf("exchange: regrouping %d records of %d groups: %w", n, g, err)
	}
	return nil
}

// save runs saveScript for st in g groups, and returns the records stored.
func (c *RedisCoordinator) save(ctx context.Context, reg, holder string, st *SavedState, g int) (int, error) {
	whole := "0"
	if st.Whole {
		whole = "1"
	}
	head := c.key(reg, "state")
	args := make([]any, 0, 6+2*len(st.Keys)+len(st.Deleted)+5*g)
	args = append(args, holder, whole, st.Head, g, head+":")
	// The deleted keys, then the records, by group.
	dels := make([][]string, g)
	for _, k := range st.Deleted {
		i := groupOf(k, g)
		dels[i] = append(dels[i], k)
	}
	nd := 0
	for _, d := range dels {
		if len(d) > 0 {
			nd++
		}
	}
	args = append(args, nd)
	for i, d := range dels {
		if len(d) > 0 {
			args = append(args, i, len(d))
			for _, k := range d {
				args = append(args, k)
			}
		}
	}
	sets := make([][]int, g)
	for j, k := range st.Keys {
		i := groupOf(k, g)
		sets[i] = append(sets[i], j)
	}
	for i, js := range sets {
		if len(js) == 0 {
			continue
		}
		// The group's short records first, then its long ones.
		short := 0
		for a, j := range js {
			if len(st.Records[j]) <= longRecord {
				js[a], js[short] = js[short], j
				short++
			}
		}
		args = append(args, i, short, len(js)-short)
		for _, j := range js {
			args = append(args, st.Keys[j], st.Records[j])
		}
	}
	res, err := saveScript.Run(ctx, c.client, []string{c.key(reg, "lease"), head}, args...).Int64Slice()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil:
		delete(c.groups, reg) // it may have been written or not: read it again
		return 0, fmt.Errorf("exchange: redis save: %w", err)
	case len(res) != 2:
		return 0, fmt.Errorf("exchange: redis save: a reply of %d values", len(res))
	case res[0] == -1:
		delete(c.groups, reg)
		return 0, fmt.Errorf("%w: region %q", ErrNoWholeState, reg)
	case res[0] != 1:
		return 0, fmt.Errorf("%w: region %q, holder %q", region.ErrNotHolder, reg, holder)
	}
	c.groups[reg] = g
	return int(res[1]), nil
}

// storedGroups returns the group count of reg's stored state, 0 when it
// is not in groups (the script then refuses a partial save).
func (c *RedisCoordinator) storedGroups(ctx context.Context, reg string) (int, error) {
	c.mu.Lock()
	g, ok := c.groups[reg]
	c.mu.Unlock()
	if ok {
		return g, nil
	}
	meta, err := c.client.HMGet(ctx, c.key(reg, "state"), "", "g").Result()
	if err != nil && !isWrongType(err) {
		return 0, fmt.Errorf("exchange: redis save: %w", err)
	}
	if len(meta) == 2 && (meta[0] == stateGrouped || meta[0] == stateGroupedShort) {
		if s, ok := meta[1].(string); ok {
			g, _ = strconv.Atoi(s)
		}
	}
	return g, nil
}

// isWrongType reports a command on a key of another type (the state of
// releases before records, a string).
func isWrongType(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "WRONGTYPE")
}

// Load returns reg's stored exchange state, whole; Head is nil when none was
// ever saved. The state of releases before, one hash of all records or a
// string, is read too. Bounded by ctx only, like Save.
func (c *RedisCoordinator) Load(ctx context.Context, reg string) (SavedState, error) {
	st := SavedState{Whole: true}
	if reg == "" {
		return st, fmt.Errorf("%w: empty region", ErrInvalidArgument)
	}
	key := c.key(reg, "state")
	typ, err := c.client.Type(ctx, key).Result()
	if err != nil {
		return st, fmt.Errorf("exchange: redis load: %w", err)
	}
	switch typ {
	case "none":
		return st, nil
	case "string":
		st.Head, err = c.client.Get(ctx, key).Bytes()
		if errors.Is(err, redis.Nil) {
			return SavedState{Whole: true}, nil
		}
		if err != nil {
			return st, fmt.Errorf("exchange: redis load: %w", err)
		}
		return st, nil
	case "hash":
	default:
		return st, fmt.Errorf("%w: exchange state %s is a %s", region.ErrMalformed, key, typ)
	}
	meta, err := c.client.HMGet(ctx, key, "", "h", "g").Result()
	if err != nil {
		return st, fmt.Errorf("exchange: redis load: %w", err)
	}
	long := meta[0] == stateGrouped
	if !long && meta[0] != stateGroupedShort {
		return c.loadHash(ctx, key)
	}
	head, _ := meta[1].(string)
	gs, _ := meta[2].(string)
	g, err := strconv.Atoi(gs)
	if meta[1] == nil || err != nil || g < 1 {
		return st, fmt.Errorf("%w: exchange state %s has head %v and %q groups", region.ErrMalformed, key, meta[1] != nil, gs)
	}
	st.Head = []byte(head)
	// Only the holder writes, and we hold the election: reading the groups
	// in steps is as consistent as one read.
	const batch = 256
	for first := 0; first < g; first += batch {
		pipe := c.client.Pipeline()
		cmds := make([]*redis.MapStringStringCmd, 0, batch)
		for i := first; i < min(first+batch, g); i++ {
			cmds = append(cmds, pipe.HGetAll(ctx, key+":"+strconv.Itoa(i)))
			if long {
				cmds = append(cmds, pipe.HGetAll(ctx, key+":"+strconv.Itoa(i)+":l"))
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return SavedState{Whole: true}, fmt.Errorf("exchange: redis load: %w", err)
		}
		for _, cmd := range cmds {
			for k, r := range cmd.Val() {
				st.Keys = append(st.Keys, k)
				st.Records = append(st.Records, []byte(r))
			}
		}
	}
	c.mu.Lock()
	c.groups[reg] = g
	c.mu.Unlock()
	return st, nil
}

// loadHash reads the state of the release before groups: one hash, the
// head at field "" and every record beside it.
func (c *RedisCoordinator) loadHash(ctx context.Context, key string) (SavedState, error) {
	st := SavedState{Whole: true}
	iter := c.client.HScan(ctx, key, 0, "", 1000).Iterator()
	for iter.Next(ctx) {
		field := iter.Val()
		if !iter.Next(ctx) {
			break
		}
		if field == "" {
			st.Head = []byte(iter.Val())
			continue
		}
		st.Keys = append(st.Keys, field)
		st.Records = append(st.Records, []byte(iter.Val()))
	}
	if err := iter.Err(); err != nil {
		return SavedState{Whole: true}, fmt.Errorf("exchange: redis load: %w", err)
	}
	if st.Head == nil {
		return SavedState{Whole: true}, fmt.Errorf("%w: exchange state %s has no head", region.ErrMalformed, key)
	}
	return st, nil
}
