package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisConfig configures a RedisStore.
type RedisConfig struct {
	// Prefix starts every Redis key the store writes. It must not contain
	// '{' or '}', which would break the Cluster hash tag. Default "ration:".
	Prefix string
	// Timeout bounds each call (Grant, Return, Shares, Ping) from start to
	// answer, on top of the caller's context. SetShares and DeleteShares,
	// which only the exchange calls (hundreds of keys a call, off every
	// request's path), are bounded by the caller's deadline when it has
	// one, and by Timeout otherwise. Default 50ms.
	Timeout time.Duration
	// ShareTTL is how long an applied share lasts after its latest write
	// (SetShares): a key holding one expires ShareTTL after that write, or
	// with its bucket if that is later, so that the share of a key whose
	// DeleteShares was lost does not stay forever. The exchange must
	// therefore write each share it relies on again at least every
	// ShareTTL/2. Rounded up to whole milliseconds; at most 2^40 ms.
	// Default 24h (DefaultShareTTL).
	ShareTTL time.Duration
	// Layout is where each key's state lives: its own Redis key
	// (LayoutKeys, the default) or a field of a hash of keys (LayoutGroups,
	// about half the memory). Either layout reads a key the other left and
	// moves it, so replicas of one region may run different layouts while
	// it switches, provided they run this version or later and agree on
	// Groups (docs/DESIGN.md, "Redis layouts (as built)"). LayoutGroups
	// needs a single server (or Sentinel) or a Cluster, not a Ring.
	Layout RedisLayout
	// Groups is how many hashes LayoutGroups spreads keys over: a power
	// of two, at least 16,384 (a Cluster's slot count) on a Redis Cluster.
	// Size it to about the active keys divided by 64: Redis keeps a hash
	// compact up to 128 fields (hash-max-listpack-entries), and a hash
	// holding a few keys costs about as much as a key of its own. Both
	// layouts use it (LayoutKeys to find a key LayoutGroups left), so it
	// must be the same on every replica of a region and must not change
	// while any key is in a group: a key would be looked for in another
	// hash. Default 131,072 (DefaultRedisGroups), for up to about ten
	// million active keys.
	Groups int
}

// DefaultShareTTL is the default RedisConfig.ShareTTL and
// MemoryConfig.ShareTTL.
const DefaultShareTTL = 24 * time.Hour

// withDefaults returns c with every zero field set to its default.
func (c RedisConfig) withDefaults() RedisConfig {
	if c.Prefix == "" {
		c.Prefix = "ration:"
	}
	if c.Timeout == 0 {
		c.Timeout = 50 * time.Millisecond
	}
	if c.ShareTTL == 0 {
		c.ShareTTL = DefaultShareTTL
	}
	if c.Groups == 0 {
		c.Groups = DefaultRedisGroups
	}
	return c
}

// Validate reports whether c, with its defaults filled, is usable by
// NewRedisStore. The error wraps ErrInvalid.
func (c RedisConfig) Validate() error { return c.withDefaults().validate() }

func (c RedisConfig) validate() error {
	if strings.ContainsAny(c.Prefix, "{}") {
		return fmt.Errorf("%w: redis prefix %q contains a brace", ErrInvalid, c.Prefix)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("%w: redis timeout %v is negative", ErrInvalid, c.Timeout)
	}
	if c.ShareTTL < 0 || c.ShareTTL > maxTTLMillis*time.Millisecond {
		return fmt.Errorf("%w: redis share TTL %v is outside (0, 2^40 ms]", ErrInvalid, c.ShareTTL)
	}
	if c.Layout != LayoutKeys && c.Layout != LayoutGroups {
		return fmt.Errorf("%w: unknown %v", ErrInvalid, c.Layout)
	}
	if !validGroups(c.Groups) {
		return fmt.Errorf("%w: redis groups %d is not a power of two in [1, 2^24]", ErrInvalid, c.Groups)
	}
	return nil
}

// RedisStore is the allocator contract on Redis or Redis Cluster: one Lua
// script call per key (bucket.lua), all keys of one call sent in one
// pipeline. Refills use the server's clock (TIME), never the caller's. It is
// safe for concurrent use.
//
// A key's state, a binary string (bucket.lua and redis_state.go give its
// form), holds the bucket (tokens, last update) and, once the exchange
// wrote one, the applied share and its escrow. Without a share it expires
// once the bucket would be full again; with one, RedisConfig.ShareTTL
// after the latest share write or with its bucket, whichever is later. It
// lives, as RedisConfig.Layout says, in a Redis key of its own,
// "<prefix>{<k escaped>}", or as a field of a hash, "<prefix>g{<tag>}",
// whose value starts with the state's expiry (redis_group.go); the script
// reads and moves a key the other layout left. Keys written before issue
// 12, the hash "<prefix>{…}:b" and the share "<prefix>{…}:s", are read
// until a write moves them. Escaping turns '%', '{' and '}' into %25, %7B
// and %7D so that the hash tag is always exactly the key; a group's tag
// lies in the same Cluster slot, so all names of a key share one.
//
// It needs Redis 7.0 or later (PEXPIRETIME, SET PXAT, PEXPIREAT GT).
type RedisStore struct {
	client  redis.UniversalClient
	cfg     RedisConfig
	scripts atomic.Bool // the script is believed loaded (SCRIPT LOAD done)
}

// NewRedisStore returns a store on client, which must honour context
// deadlines (ContextTimeoutEnabled, as NewRedisClient sets it) so that
// RedisConfig.Timeout bounds every call.
func NewRedisStore(client redis.UniversalClient, cfg RedisConfig) (*RedisStore, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalid)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if _, ok := client.(*redis.ClusterClient); ok && cfg.Groups < clusterSlots {
		// A script's keys must share a slot: a key's name and its group's
		// do only when every slot has groups of its own.
		return nil, fmt.Errorf("%w: redis groups %d on a Redis Cluster: want at least %d", ErrInvalid, cfg.Groups, clusterSlots)
	}
	if _, ok := client.(*redis.Ring); ok && cfg.Layout == LayoutGroups {
		// A ring places a key's own name and its group by their hash
		// tags, which differ, on servers that need not be one.
		return nil, fmt.Errorf("%w: redis layout %v on a Ring: want a single server or a Cluster", ErrInvalid, cfg.Layout)
	}
	if !contextTimeoutEnabled(client) {
		return nil, fmt.Errorf("%w: redis client must set ContextTimeoutEnabled, or a hung server blocks calls past RedisConfig.Timeout (NewRedisClient sets it)", ErrInvalid)
	}
	slotTags() // built here, not inside the first call's deadline (about 3 ms)
	return &RedisStore{client: client, cfg: cfg}, nil
}

// Client is the Redis client the store runs on: sync/exchange keeps the
// region's holder election and exchange state beside the buckets with it.
func (s *RedisStore) Client() redis.UniversalClient { return s.client }

// Config is the store's configuration, defaults filled.
func (s *RedisStore) Config() RedisConfig { return s.cfg }

func contextTimeoutEnabled(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true // a wrapper we cannot inspect: trust it
}

var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// stateKey is the one Redis key of key. No suffix: a byte less often puts
// the key's string in a smaller allocation (see TestRedisMemoryPerKey).
func (s *RedisStore) stateKey(key string) string {
	return s.cfg.Prefix + "{" + keyEscaper.Replace(key) + "}"
}

// oldBucketKey and oldShareKey are key's names before issue 12, read by
// the script until it moves them into stateKey.
func (s *RedisStore) oldBucketKey(key string) string { return s.stateKey(key) + ":b" }
func (s *RedisStore) oldShareKey(key string) string  { return s.stateKey(key) + ":s" }

// groupKey is the hash holding key in LayoutGroups.
func (s *RedisStore) groupKey(key string) string {
	return groupKey(s.cfg.Prefix, keyEscaper.Replace(key), s.cfg.Groups)
}

// keyNames is KEYS for key's script calls: the state's place in this
// layout, its place in the other, then the names before issue 12.
func (s *RedisStore) keyNames(key string) []string {
	esc := keyEscaper.Replace(key)
	own := s.cfg.Prefix + "{" + esc + "}"
	group := groupKey(s.cfg.Prefix, esc, s.cfg.Groups)
	if s.cfg.Layout == LayoutGroups {
		return []string{group, own, own + ":b", own + ":s"}
	}
	return []string{own, group, own + ":b", own + ":s"}
}

// Grant answers reqs in order, one Grant per request in out (len(out) must
// equal len(reqs)), with MemoryStore.GrantAt's semantics at the server's
// time. An invalid item gets Grant.Err (wrapping ErrInvalid), is not sent
// and debits nothing. The call returns an error wrapping
// ErrUnavailable when Redis cannot be reached within RedisConfig.Timeout;
// the valid items' results are then unknown (some may have been debited,
// which costs utilisation, never the bound).
func (s *RedisStore) Grant(ctx context.Context, reqs []GrantRequest, out []Grant) error {
	if len(out) != len(reqs) {
		return fmt.Errorf("%w: %d requests and %d results", ErrInvalid, len(reqs), len(out))
	}
	idx := make([]int, 0, len(reqs))
	for i, r := range reqs {
		out[i] = Grant{}
		if err := validateGrant(r); err != nil {
			out[i].Err = err
			continue
		}
		idx = append(idx, i)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	replies, err := s.run(ctx, len(idx), func(i int) scriptItem {
		r := reqs[idx[i]]
		it := scriptItem{key: r.Key, limit: r.Limit, op: opGrant, n: r.Want, maxShare: r.MaxShare}
		if u := r.Raise; u != nil {
			it.raise, it.gen, it.received = u.Steps, u.Gen, u.Received
		}
		return it
	})
	if err != nil {
		return err
	}
	for i, rep := range replies {
		r := reqs[idx[i]]
		if rep.err != nil {
			out[idx[i]] = Grant{Err: fmt.Errorf("key %q: %w", r.Key, rep.err)}
			continue
		}
		out[idx[i]] = grantResult(r.Limit, rep.sharePPM, rep.granted, rep.tokens, rep.untilEnd)
	}
	return nil
}

// itemError returns the first item error of a Return or SetShares call:
// those batches cannot check a fixed window against Redis's clock before
// they are sent, so such an item fails the call after the others applied.
func itemError(replies []scriptReply) error {
	for _, r := range replies {
		if r.err != nil {
			return r.err
		}
	}
	return nil
}

// Return credits returned tokens, each bucket capped at its capacity. Any
// invalid item rejects the whole call (ErrInvalid) before anything is sent;
// an ErrUnavailable failure may leave some items applied.
func (s *RedisStore) Return(ctx context.Context, reqs []ReturnRequest) error {
	if err := validateAll(reqs, validateReturn); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	replies, err := s.run(ctx, len(reqs), func(i int) scriptItem {
		return scriptItem{key: reqs[i].Key, limit: reqs[i].Limit, op: opReturn, n: reqs[i].Tokens}
	})
	if err != nil {
		return err
	}
	return itemError(replies)
}

// SetShares applies shares with MemoryStore.SetSharesAt's semantics at the
// server's time, one ShareResult per update in out unless out is nil. Any
// invalid item rejects the whole call (ErrInvalid) before anything is sent;
// an ErrUnavailable failure may leave some items applied (their results are
// unknown: the tokens they released are lost, never created), so the
// exchange retries a failed call with the same shares, which credits
// nothing twice.
func (s *RedisStore) SetShares(ctx context.Context, ups []ShareUpdate, out []ShareResult) error {
	if out != nil && len(out) != len(ups) {
		return fmt.Errorf("%w: %d updates and %d results", ErrInvalid, len(ups), len(out))
	}
	if err := validateAll(ups, validateShare); err != nil {
		return err
	}
	ctx, cancel := s.exchangeBound(ctx)
	defer cancel()
	replies, err := s.run(ctx, len(ups), func(i int) scriptItem {
		u := ups[i]
		return scriptItem{key: u.Key, limit: u.Limit, op: opShare, n: u.SharePPM, gen: u.Gen, received: u.Received, window: u.Window, raise: u.Steps}
	})
	if err == nil {
		err = itemError(replies)
	}
	if err != nil || out == nil {
		return err
	}
	for i, rep := range replies {
		out[i] = ShareResult{Released: rep.granted, Tokens: rep.tokens, Window: rep.window}
	}
	return nil
}

// Shares writes the applied share in ppm of each key to out (len(out) must
// equal len(keys)); -1 means no share was applied or it expired.
func (s *RedisStore) Shares(ctx context.Context, keys []string, out []int64) error {
	if len(out) != len(keys) {
		return fmt.Errorf("%w: %d keys and %d results", ErrInvalid, len(keys), len(out))
	}
	if err := validateAll(keys, validateKey); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	reads := make([]stateReads, len(keys))
	for i, k := range keys {
		reads[i] = s.readState(ctx, pipe, k, false)
	}
	now := pipe.Time(ctx) // a group's field expires by the value it holds
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return s.fail("shares", err)
	}
	t, err := now.Result()
	if err != nil {
		return s.fail("shares", err)
	}
	for i := range keys {
		e, err := reads[i].entry(t.UnixMilli())
		if err != nil {
			return fmt.Errorf("lease: redis share of %q: %w", keys[i], err)
		}
		out[i] = -1
		if e.hasShare {
			out[i] = int64(e.share)
		}
	}
	return nil
}

// Ping checks that Redis answers within RedisConfig.Timeout.
func (s *RedisStore) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		return s.fail("ping", err)
	}
	return nil
}

// run calls the script for n items in one pipeline and decodes the replies.
// item(i) gives the i-th item. The caller bounds ctx.
//
// The script is loaded once (SCRIPT LOAD, on every shard of a cluster) and
// then called by EVALSHA. Items that meet NOSCRIPT (a restarted or failed
// over server) are sent again in a second pipeline with EVAL, which also
// caches the script on that server.
func (s *RedisStore) run(ctx context.Context, n int, item func(int) scriptItem) ([]scriptReply, error) {
	if n == 0 {
		return nil, nil
	}
	if !s.scripts.Load() {
		// A failure here is not fatal: EVALSHA will meet NOSCRIPT and fall
		// back to EVAL, or fail the same way if Redis is unreachable.
		if err := s.client.ScriptLoad(ctx, bucketScript).Err(); err == nil {
			s.scripts.Store(true)
		} else if ctx.Err() != nil {
			return nil, s.fail("script load", err)
		}
	}
	keys := make([][]string, n)
	args := make([][]any, n)
	for i := range n {
		it := item(i)
		it.shareTTL, it.layout = s.cfg.ShareTTL, s.cfg.Layout
		keys[i] = s.keyNames(it.key)
		args[i] = scriptArgs(it)
	}
	cmds := make([]*redis.Cmd, n)
	pipe := s.client.Pipeline()
	for i := range n {
		cmds[i] = pipe.EvalSha(ctx, bucketScriptSHA, keys[i], args[i]...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error

	var retry []int
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		s.scripts.Store(false)
		pipe := s.client.Pipeline()
		for _, i := range retry {
			cmds[i] = pipe.Eval(ctx, bucketScript, keys[i], args[i]...)
		}
		_, _ = pipe.Exec(ctx)
	}

	replies := make([]scriptReply, n)
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			if redis.HasErrorPrefix(err, "ration: the store clock") {
				replies[i].err = fmt.Errorf("%w (%v)", errClockOutsideWindow, err)
				continue
			}
			return nil, s.fail("script", err)
		}
		rep, err := parseScriptReply(c.Val())
		if err != nil {
			return nil, err
		}
		replies[i] = rep
	}
	return replies, nil
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// exchangeBound bounds an exchange call (SetShares, DeleteShares) by the
// caller's deadline, and by RedisConfig.Timeout only without one: a batch
// of 500 share writes has the exchange's budget, not a lease's (at 50ms on
// a loaded machine the batches of a 100,000-key epoch failed and the epoch
// took seconds).
func (s *RedisStore) exchangeBound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.cfg.Timeout)
}

// fail wraps a Redis error. Anything that means "Redis did not serve this
// call now" (network errors, timeouts, a closed client, a server that is
// loading, failing over or read-only) wraps ErrUnavailable, so callers
// apply their failure mode; other error replies point at a bug or foreign
// data and are returned as they are.
func (s *RedisStore) fail(what string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) && !transientReply(rerr.Error()) {
		return fmt.Errorf("lease: redis %s: %w", what, err)
	}
	return fmt.Errorf("%w: redis %s: %w", ErrUnavailable, what, err)
}

func transientReply(msg string) bool {
	for _, p := range []string{"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY", "BUSY", "NOREPLICAS"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// DeleteShares removes the applied shares of keys: their buckets fall back
// to Limit.InitialShare (the exchange retires a key at rest this way, where
// the initial share is at most the applied one) and expire as their own
// (a key whose bucket has expired goes at once). Stored tokens above the
// lower capacity are clipped at the bucket's next use. An ErrUnavailable
// failure may leave some keys deleted; retrying is harmless.
func (s *RedisStore) DeleteShares(ctx context.Context, keys []string) error {
	if err := validateAll(keys, validateKey); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := s.exchangeBound(ctx)
	defer cancel()
	_, err := s.run(ctx, len(keys), func(i int) scriptItem {
		return scriptItem{key: keys[i], op: opDeleteShare}
	})
	return err
}
