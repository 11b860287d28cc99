package lease

import (
	"flag"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

var modelSeed = flag.Uint64("model.seed", 0, "seed for TestMemoryStoreMatchesModel (0: random)")

// model is a deliberately naive allocator: plain maps, time.Time and
// Duration.Seconds, no sharding, no clamping tricks beyond the contract's
// words. The MemoryStore must answer like it.
type model struct {
	buckets map[string]*modelBucket
	shares  map[string]int64
	escrow  map[string]modelEscrow
	// shareExp is when a key with a share vanishes (ms; 0 never): holdMS
	// after its latest share write, never before its bucket.
	shareExp map[string]int64
	holdMS   int64
}

// modelEscrow is what a key's store credited of the tokens given to it:
// the newest generation seen and the cumulative tokens credited in it.
type modelEscrow struct {
	gen      uint64
	window   int64
	credited int64
}

type modelBucket struct {
	tokens   float64
	last     time.Time
	expireAt int64 // ms; 0 never
	// A fixed window's: the start of the bucket's window and the end of
	// the one its last operation was in (µs).
	win, end int64
}

// modelWindow is the window of l's boundaries that holds t (µs).
func modelWindow(l Limit, t int64) (start, end int64, ok bool) {
	for i := 0; i < 3; i++ {
		if l.Window[i] <= t && t < l.Window[i+1] {
			return l.Window[i], l.Window[i+1], true
		}
	}
	return 0, 0, false
}

// windowOK reports whether a fixed window's boundaries hold the time the
// store uses for key: now, or the bucket's last update when later.
func (m *model) windowOK(now time.Time, key string, l Limit) bool {
	if l.Window == ([4]int64{}) {
		return true
	}
	t := now.UnixMicro()
	if b, ok := m.buckets[key]; ok && (b.expireAt == 0 || now.UnixMilli() <= b.expireAt) {
		t = max(t, b.last.UnixMicro())
	}
	_, _, ok := modelWindow(l, t)
	return ok
}

func newModel(hold time.Duration) *model {
	return &model{buckets: map[string]*modelBucket{}, shares: map[string]int64{}, escrow: map[string]modelEscrow{},
		shareExp: map[string]int64{}, holdMS: hold.Milliseconds()}
}

// forget drops key's share once it has expired.
func (m *model) forget(now time.Time, key string) {
	if e, ok := m.shareExp[key]; ok && e != 0 && now.UnixMilli() > e {
		delete(m.shares, key)
		delete(m.escrow, key)
		delete(m.shareExp, key)
	}
}

// holdShare sets when key's share expires after its bucket b was updated,
// by a share write or not.
func (m *model) holdShare(key string, b *modelBucket, written bool) {
	if _, ok := m.shares[key]; !ok {
		return
	}
	old := m.shareExp[key]
	switch {
	case b.expireAt == 0 || (!written && old == 0):
		m.shareExp[key] = 0
	case written:
		m.shareExp[key] = max(b.expireAt, (b.last.UnixMicro()+999)/1000+m.holdMS)
	default:
		m.shareExp[key] = max(b.expireAt, old)
	}
}

// deleteShare drops key's share; its bucket goes too if it has expired.
func (m *model) deleteShare(now time.Time, key string) {
	delete(m.shares, key)
	delete(m.escrow, key)
	delete(m.shareExp, key)
	if b, ok := m.buckets[key]; ok && b.expireAt != 0 && now.UnixMilli() > b.expireAt {
		delete(m.buckets, key)
	}
}

func (m *model) clone() *model {
	c := newModel(time.Duration(m.holdMS) * time.Millisecond)
	for k, v := range m.shareExp {
		c.shareExp[k] = v
	}
	for k, b := range m.buckets {
		cp := *b
		c.buckets[k] = &cp
	}
	for k, v := range m.shares {
		c.shares[k] = v
	}
	for k, v := range m.escrow {
		c.escrow[k] = v
	}
	return c
}

func (m *model) params(key string, l Limit) (rate, capacity float64, share int64) {
	share = l.InitialShare
	if s, ok := m.shares[key]; ok {
		share = s
	}
	frac := float64(share) / 1e6
	return l.Rate * frac, math.Max(l.Burst*frac, float64(l.Cost)), share
}

// bucket returns key's bucket refilled to now, creating it if it is
// missing or idle past its expiry.
func (m *model) bucket(now time.Time, key string, l Limit, rate, capacity float64) *modelBucket {
	b, ok := m.buckets[key]
	if ok && b.expireAt != 0 && now.UnixMilli() > b.expireAt {
		ok = false
	}
	if l.Window != ([4]int64{}) {
		// A fixed window: no refill within it; full again in a newer one.
		t := now.UnixMicro()
		if ok {
			t = max(t, b.last.UnixMicro())
		}
		start, end, _ := modelWindow(l, t) // the caller checked windowOK
		if !ok {
			b = &modelBucket{tokens: capacity, last: now, win: start}
			if l.StartEmpty {
				b.tokens = 0
			}
			m.buckets[key] = b
		}
		if start > b.win {
			b.tokens, b.win = capacity, start
		}
		b.tokens = math.Min(capacity, b.tokens)
		if now.After(b.last) {
			b.last = now
		}
		b.end = end
		return b
	}
	if !ok {
		b = &modelBucket{tokens: capacity, last: now}
		if l.StartEmpty {
			b.tokens = 0
		}
		m.buckets[key] = b
	}
	b.end = 0
	if now.After(b.last) {
		b.tokens = math.Min(capacity, b.tokens+now.Sub(b.last).Seconds()*rate)
		b.last = now
	} else {
		b.tokens = math.Min(capacity, b.tokens)
	}
	return b
}

// sweep forgets expired buckets. It matters only when the clock later
// goes back before their expiry: a forgotten bucket starts afresh, one
// still held is clamped (as Redis, which expires keys lazily, may do).
func (m *model) sweep(now time.Time) {
	for k := range m.shareExp {
		m.forget(now, k)
	}
	for k, b := range m.buckets {
		if b.expireAt != 0 && now.UnixMilli() > b.expireAt {
			delete(m.buckets, k)
		}
	}
}

func (m *model) setExpiry(b *modelBucket, rate, capacity float64) {
	b.expireAt = 0
	if b.end != 0 {
		b.expireAt = (b.end + 999) / 1000 // a fixed window's bucket vanishes at its end
		return
	}
	if rate > 0 {
		ttl := math.Ceil(2 * capacity / rate * 1000)
		if ttl <= maxTTLMillis {
			lastMS := (b.last.UnixMicro() + 999) / 1000
			b.expireAt = lastMS + int64(ttl)
		}
	}
}

func modelValid(key string, l Limit) bool {
	return key != "" && l.Rate > 0 && !math.IsInf(l.Rate, 1) && l.Burst > 0 && !math.IsInf(l.Burst, 1) &&
		l.Cost > 0 && float64(l.Cost) <= l.Burst && l.InitialShare >= 0 && l.InitialShare <= region.PPM
}

// grant returns granted, tokens left, retryAfter and whether the item is
// valid; near a whole-cost boundary float rounding may go either way, so
// it also reports how far tokens/cost is from the nearest integer.
func (m *model) grant(now time.Time, r GrantRequest) (granted int64, g Grant, margin float64, ok bool) {
	if !modelValid(r.Key, r.Limit) || r.Want < r.Limit.Cost || !m.windowOK(now, r.Key, r.Limit) {
		return 0, Grant{}, 0, false
	}
	m.forget(now, r.Key)
	rate, capacity, _ := m.params(r.Key, r.Limit)
	b := m.bucket(now, r.Key, r.Limit, rate, capacity)
	n := math.Floor(b.tokens / float64(r.Limit.Cost))
	margin = math.Abs(b.tokens/float64(r.Limit.Cost) - math.Round(b.tokens/float64(r.Limit.Cost)))
	granted = min(int64(n), r.Want/r.Limit.Cost) * r.Limit.Cost
	b.tokens -= float64(granted)
	m.setExpiry(b, rate, capacity)
	m.holdShare(r.Key, b, false)
	g = Grant{Granted: granted, Tokens: b.tokens, Rate: rate, Capacity: capacity}
	if granted == 0 {
		switch {
		case b.end != 0: // a fixed window refills at its end only
			g.RetryAfter = min(time.Duration(b.end-b.last.UnixMicro())*time.Microsecond, MaxRetryAfter)
		case rate == 0:
			g.RetryAfter = NoRefillRetryAfter
		default:
			us := math.Ceil((float64(r.Limit.Cost) - b.tokens) / rate * 1e6)
			g.RetryAfter = MaxRetryAfter
			if us < float64(MaxRetryAfter/time.Microsecond) {
				g.RetryAfter = time.Duration(us) * time.Microsecond
			}
		}
	}
	return granted, g, margin, true
}

func (m *model) ret(now time.Time, r ReturnRequest) {
	m.forget(now, r.Key)
	rate, capacity, _ := m.params(r.Key, r.Limit)
	b := m.bucket(now, r.Key, r.Limit, rate, capacity)
	b.tokens = math.Min(capacity, b.tokens+float64(r.Tokens))
	m.setExpiry(b, rate, capacity)
	m.holdShare(r.Key, b, false)
}

// setShare returns the tokens released, in thousandths: a missing bucket
// is the one it stands for at the old share, credited what was given and
// not credited yet in the newest generation, then capped at the new
// capacity, the excess released.
func (m *model) setShare(now time.Time, u ShareUpdate) (released int64, tokens float64) {
	m.forget(now, u.Key)
	rate, capacity, _ := m.params(u.Key, u.Limit)
	b := m.bucket(now, u.Key, u.Limit, rate, capacity)
	e := m.escrow[u.Key]
	var credit int64
	// Eras (generation, window) in order; a fixed window's tokens count
	// only in the window the bucket is in.
	newer := u.Gen > e.gen || (u.Gen == e.gen && u.Window > e.window)
	if u.Gen > 0 && u.Window == b.win && (newer || (u.Gen == e.gen && u.Window == e.window)) {
		if newer {
			e = modelEscrow{gen: u.Gen, window: u.Window}
		}
		if u.Received > e.credited {
			credit, e.credited = u.Received-e.credited, u.Received
		}
	}
	m.escrow[u.Key] = e
	m.shares[u.Key] = u.SharePPM
	rate, capacity, _ = m.params(u.Key, u.Limit)
	b.tokens += float64(credit) / 1000
	if b.tokens > capacity {
		released = int64(math.Floor((b.tokens - capacity) * 1000))
		b.tokens = capacity
	}
	m.setExpiry(b, rate, capacity)
	m.holdShare(u.Key, b, true)
	return released, b.tokens
}

func randomLimit(rng *rand.Rand) Limit {
	cost := []int64{1, 1, 3, 10}[rng.IntN(4)]
	l := Limit{
		Rate:         []float64{0.5, 10, 1000, 1e5}[rng.IntN(4)],
		Burst:        float64(cost) * float64(1+rng.IntN(100)),
		Cost:         cost,
		InitialShare: []int64{0, 1, 250_000, 333_333, region.PPM}[rng.IntN(5)],
		StartEmpty:   rng.IntN(4) == 0,
	}
	if rng.IntN(20) == 0 { // an invalid limit now and then
		l.Cost = int64(l.Burst) + 1
	}
	return l
}

// TestMemoryStoreMatchesModel runs seeded random operations against the
// MemoryStore and the naive model and compares every answer. Rerun a
// failure with -model.seed=N.
func TestMemoryStoreMatchesModel(t *testing.T) {
	seed := *modelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -model.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))

	keys := []string{"a", "b", "c", "d", ""}
	limits := map[string]Limit{}
	// grid is, for a fixed-window key, its windows' length in µs: its
	// boundaries are cut around the clock before each operation, now and
	// then a window off so that they miss the store's clock.
	grid := map[string]int64{}
	newLimit := func(k string) {
		limits[k], grid[k] = randomLimit(rng), 0
		if rng.IntN(3) == 0 {
			grid[k] = []int64{50_000, 700_000, 3_000_000}[rng.IntN(3)]
		}
	}
	for _, k := range keys {
		newLimit(k)
	}
	var now time.Time
	lim := func(k string) Limit {
		l := limits[k]
		if d := grid[k]; d > 0 {
			start := now.UnixMicro() / d * d
			if rng.IntN(40) == 0 {
				start += 3 * d // boundaries that do not hold the clock
			}
			l.Window = [4]int64{start - d, start, start + d, start + 2*d}
		}
		return l
	}
	// Shares last 20 s after their latest write: the run spans minutes.
	const hold = 20 * time.Second
	store, mod := NewMemoryStore(MemoryConfig{Shards: 2, Clock: func() time.Time { return now }, ShareTTL: hold}), newModel(hold)
	var snapStore *MemoryStore
	var snapModel *model
	now = epoch
	const ops = 20_000
	for op := range ops {
		key := keys[rng.IntN(len(keys))]
		switch p := rng.IntN(100); {
		case p < 35: // advance the clock, sometimes backwards
			now = now.Add(time.Duration(rng.Int64N(300_000)) * time.Microsecond)
			if rng.IntN(30) == 0 {
				now = now.Add(-time.Duration(rng.Int64N(1_000_000)) * time.Microsecond)
			}
		case p < 75: // a batch of grants
			reqs := make([]GrantRequest, 1+rng.IntN(4))
			for i := range reqs {
				k := keys[rng.IntN(len(keys))]
				reqs[i] = GrantRequest{Key: k, Want: rng.Int64N(60) - 2, Limit: lim(k)}
			}
			out := make([]Grant, len(reqs))
			store.GrantAt(now, reqs, out)
			for i, r := range reqs {
				granted, want, margin, valid := mod.grant(now, r)
				got := out[i]
				if (got.Err == nil) != valid {
					t.Fatalf("op %d item %d %+v: got err %v, model says valid=%v", op, i, r, got.Err, valid)
				}
				if !valid {
					continue
				}
				tol := 1e-9 * math.Max(1, want.Capacity)
				near := margin < 1e-9
				if (got.Granted != granted && !near) || math.Abs(got.Tokens-want.Tokens) > tol && !near ||
					got.Rate != want.Rate || got.Capacity != want.Capacity ||
					(!near && absDur(got.RetryAfter-want.RetryAfter) > time.Microsecond) {
					t.Fatalf("op %d at %v item %d %+v:\ngot  %+v\nwant %+v", op, now.Sub(epoch), i, r, got, want)
				}
				// Carry the store's exact value on, so float drift does not
				// compound across thousands of operations.
				mod.buckets[r.Key].tokens = got.Tokens
			}
		case p < 85:
			r := ReturnRequest{Key: key, Tokens: rng.Int64N(20) - 1, Limit: lim(key)}
			err := store.ReturnAt(now, []ReturnRequest{r})
			valid := modelValid(r.Key, r.Limit) && r.Tokens > 0 && mod.windowOK(now, r.Key, r.Limit)
			if (err == nil) != valid {
				t.Fatalf("op %d: Return %+v: got err %v, model says valid=%v", op, r, err, valid)
			}
			if valid {
				mod.ret(now, r)
			}
		case p < 92:
			u := ShareUpdate{Key: key, SharePPM: rng.Int64N(region.PPM+2) - 1, Limit: lim(key)}
			if rng.IntN(2) == 0 { // tokens given with share, now and then duplicated or old
				u.Gen, u.Received = uint64(1+rng.IntN(3)), rng.Int64N(50_000)-1
				if u.Limit.Window != ([4]int64{}) {
					u.Window = u.Limit.Window[rng.IntN(3)] // this window's, the one before, or the next
				}
			}
			out := make([]ShareResult, 1)
			err := store.SetSharesAt(now, []ShareUpdate{u}, out)
			valid := modelValid(u.Key, u.Limit) && u.SharePPM >= 0 && u.SharePPM <= region.PPM && u.Received >= 0 && mod.windowOK(now, u.Key, u.Limit)
			if (err == nil) != valid {
				t.Fatalf("op %d: SetShares %+v: got err %v, model says valid=%v", op, u, err, valid)
			}
			if valid {
				released, tokens := mod.setShare(now, u)
				if d := out[0].Released - released; d > 1 || d < -1 || math.Abs(out[0].Tokens-tokens) > 1e-9*math.Max(1, tokens) {
					t.Fatalf("op %d at %v: SetShares %+v: got %+v, want released %d tokens %v", op, now.Sub(epoch), u, out[0], released, tokens)
				}
				mod.buckets[u.Key].tokens = out[0].Tokens
			}
		case p < 93: // the policy changes a key's limit
			newLimit(key)
		case p < 94: // the exchange retires a key, or reads what it applied
			if key == "" {
				break
			}
			if err := store.DeleteShares(t.Context(), []string{key}); err != nil {
				t.Fatal(err)
			}
			mod.deleteShare(now, key)
			k := keys[rng.IntN(len(keys)-1)]
			got := make([]int64, 1)
			if err := store.Shares(t.Context(), []string{k}, got); err != nil {
				t.Fatal(err)
			}
			mod.forget(now, k)
			want, ok := mod.shares[k]
			if !ok {
				want = -1
			}
			if got[0] != want {
				t.Fatalf("op %d at %v: share of %q: got %d, want %d", op, now.Sub(epoch), k, got[0], want)
			}
		case p < 96: // sweeping drops what has expired
			store.Sweep(now)
			mod.sweep(now)
		case p < 98:
			snapStore, snapModel = store.Clone(), mod.clone()
		default: // a failover loses the writes since the snapshot
			if snapStore != nil {
				store.Restore(snapStore)
				mod = snapModel.clone()
			}
		}
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
