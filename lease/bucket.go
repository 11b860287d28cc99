package lease

import (
	"fmt"
	"math"
	"time"

	"github.com/ration-dev/ration/region"
)

// This file is the allocator contract's arithmetic, shared by MemoryStore
// and by the Go side of RedisStore. The Lua script (bucket.lua) repeats the
// same expressions in the same order, so that both stores compute the same
// float64 values from the same inputs.
//
// Time inside the contract is an integer count of microseconds on the
// store's clock (Redis TIME has microsecond resolution); expiry is in
// milliseconds, as Redis keeps it.

const (
	// NoRefillRetryAfter is Grant.RetryAfter for a bucket whose rate is 0
	// (share 0): such a bucket never refills by itself, only a share change
	// can give it tokens, and the exchange moves shares at most once an
	// epoch (1 s by default). Asking again earlier than the true refill time
	// is always safe; it costs a round trip, never an over-admission.
	NoRefillRetryAfter = time.Second
	// MaxRetryAfter caps Grant.RetryAfter for very slow buckets, so that a
	// retry hint stays finite and a share raised meanwhile is noticed.
	MaxRetryAfter = time.Hour

	// maxTTLMillis is the longest bucket expiry the stores set; a bucket
	// that would need longer (a tiny rate) never expires, like a rate of 0.
	// 2^40 ms is about 35 years and stays exact in a Lua double.
	maxTTLMillis = 1 << 40

	// maxEscrow bounds a ShareUpdate's generation and received tokens: the
	// Lua script holds them in doubles, exact up to 2^53.
	maxEscrow = 1 << 53
)

// bucket is one regional token bucket's state.
type bucket struct {
	tokens float64
	// last is the store time of the last update, in µs. It never moves
	// backwards: a store clock that jumps back is clamped to it.
	last int64
	// win is a fixed window's start (Unix µs) when the bucket was last
	// updated; 0 for a token bucket.
	win int64
}

// newBucket is the state of a key without a bucket, in the fixed window
// starting at win (0 for a token bucket): full, or empty when the rule asks
// missing buckets to start empty.
func newBucket(nowUS int64, capacity float64, startEmpty bool, win int64) bucket {
	b := bucket{tokens: capacity, last: nowUS, win: win}
	if startEmpty {
		b.tokens = 0
	}
	return b
}

// errClockOutsideWindow is the item error of a fixed window whose
// boundaries do not span the store's clock (the caller's clock is a window
// away from the store's).
var errClockOutsideWindow = fmt.Errorf("%w: the store's clock is outside the fixed window's boundaries", ErrInvalid)

// windowAt returns the fixed window of l that contains nowUS, [start, end),
// or ok false when l.Window spans no window containing it.
func (l Limit) windowAt(nowUS int64) (start, end int64, ok bool) {
	w := l.Window
	switch {
	case nowUS >= w[1] && nowUS < w[2]:
		return w[1], w[2], true
	case nowUS >= w[2] && nowUS < w[3]:
		return w[2], w[3], true
	case nowUS >= w[0] && nowUS < w[1]:
		return w[0], w[1], true
	}
	return 0, 0, false
}

// advance brings b forward to nowUS, clamped to b.last: a token bucket
// refills; a fixed window enters the window its clock is in, full again
// when that window is newer than the bucket's. It returns the end of a
// fixed window (0 for a token bucket), and false when the store's clock is
// outside l.Window (b is unchanged then).
func (b *bucket) advance(nowUS int64, l Limit, rate, capacity float64) (end int64, ok bool) {
	if !l.Fixed() {
		b.refill(nowUS, rate, capacity)
		return 0, true
	}
	now := max(nowUS, b.last)
	start, end, ok := l.windowAt(now)
	if !ok {
		return 0, false
	}
	if start > b.win {
		b.tokens, b.win = capacity, start
	}
	b.tokens = min(b.tokens, capacity)
	b.last = now
	return end, true
}

// refill brings b forward to nowUS at rate, capped at capacity. A nowUS
// before b.last counts as b.last: a backward clock jump adds nothing and
// takes nothing.
func (b *bucket) refill(nowUS int64, rate, capacity float64) {
	if nowUS < b.last {
		nowUS = b.last
	}
	elapsed := float64(nowUS-b.last) / 1e6
	// The explicit conversion forbids a fused multiply-add, which the Lua
	// side cannot do, so both stores round alike on every platform.
	t := b.tokens + float64(elapsed*rate)
	if t > capacity {
		t = capacity
	}
	b.tokens = t
	b.last = nowUS
}

// take debits the largest whole number of costs that both the bucket and
// want allow, and returns it.
func (b *bucket) take(want, cost int64) int64 {
	c := float64(cost)
	n := math.Floor(b.tokens / c)
	if n*c > b.tokens {
		// The quotient rounded up to a whole number just above the truth;
		// granting it would leave a (tiny) negative balance.
		n--
	}
	if w := float64(want / cost); n > w {
		n = w
	}
	granted := int64(n) * cost
	b.tokens -= float64(granted)
	return granted
}

// give credits n returned tokens, capped at capacity.
func (b *bucket) give(n int64, capacity float64) {
	t := b.tokens + float64(n)
	if t > capacity {
		t = capacity
	}
	b.tokens = t
}

// reshare moves b, already refilled at the old share, to a new capacity:
// it credits credit tokens (TokenScale units) and takes out what is above
// capacity, returning that in TokenScale units, rounded down.
func (b *bucket) reshare(credit int64, capacity float64) (released int64) {
	// Two separate steps, as in bucket.lua: no fused multiply-add.
	t := b.tokens + float64(credit)/region.TokenScale
	if t > capacity {
		released = int64(math.Floor(float64((t - capacity) * region.TokenScale)))
		t = capacity
	}
	b.tokens = t
	return released
}

// escrow is what a key's store credited of the tokens given to its region:
// the newest era seen (the exchange generation and, for a fixed window, the
// window) and the tokens credited in it (region.TokenScale units). It lives
// and expires with the applied share.
type escrow struct {
	gen      uint64
	window   int64
	credited int64
}

// credit returns the part of u.Received the store has not credited yet and
// records it. A newer era starts from nothing; an older one, Gen 0, and a
// fixed window's tokens of a window other than the bucket's current one
// (cur) credit nothing.
func (e *escrow) credit(u ShareUpdate, cur int64) int64 {
	switch {
	case u.Gen == 0 || u.Window != cur:
		return 0
	case u.Gen < e.gen || (u.Gen == e.gen && u.Window < e.window):
		return 0
	case u.Gen > e.gen || u.Window > e.window:
		*e = escrow{gen: u.Gen, window: u.Window}
	}
	if u.Received <= e.credited {
		return 0
	}
	c := u.Received - e.credited
	e.credited = u.Received
	return c
}

// expireAtMillis is when an idle bucket updated at lastUS may vanish: once
// it would be full again, 2 × capacity / rate after its last update, or a
// fixed window's at its end (endUS, not 0). It returns 0 when the bucket
// must never expire (rate 0, or too slow).
func expireAtMillis(lastUS int64, rate, capacity float64, endUS int64) int64 {
	if endUS != 0 {
		return ceilDiv(endUS, 1000)
	}
	if !(rate > 0) {
		return 0
	}
	ttl := math.Ceil(2 * capacity / rate * 1000)
	if !(ttl <= maxTTLMillis) {
		return 0
	}
	return ceilDiv(lastUS, 1000) + int64(ttl)
}

// shareExpireAtMillis is when a key holding an applied share may vanish,
// after its bucket was updated to expire at bucketMS (0 never) at lastUS:
// on a share write (written), ShareTTL (holdMS) after it and never before
// the bucket; otherwise no earlier than the key's expiry so far (keyMS).
// A bucket or key that never expires keeps the key forever.
func shareExpireAtMillis(bucketMS, keyMS, lastUS, holdMS int64, written bool) int64 {
	switch {
	case bucketMS == 0:
		return 0
	case written:
		return max(bucketMS, ceilDiv(lastUS, 1000)+holdMS)
	case keyMS == 0:
		return 0
	}
	return max(bucketMS, keyMS)
}

// expired reports whether a bucket with the given expiry is gone at nowUS,
// as Redis decides it: a key expires once the millisecond clock passes its
// expiry time.
func expired(expireAtMS, nowUS int64) bool {
	return expireAtMS != 0 && floorDiv(nowUS, 1000) > expireAtMS
}

// retryAfter is the time until a bucket holding tokens at rate has one cost
// again, capped at MaxRetryAfter, or NoRefillRetryAfter at rate 0.
func retryAfter(tokens float64, cost int64, rate float64) time.Duration {
	if !(rate > 0) {
		return NoRefillRetryAfter
	}
	us := math.Ceil((float64(cost) - tokens) / rate * 1e6)
	switch {
	case us <= 0:
		return 0
	case us >= float64(MaxRetryAfter/time.Microsecond):
		return MaxRetryAfter
	}
	return time.Duration(us) * time.Microsecond
}

// grantResult is the Grant reported for one item, from what the store
// computed: tokens granted, tokens left, the share in force and, for a fixed
// window, the time until its end in µs (a window refills only then).
func grantResult(l Limit, sharePPM, granted int64, tokens float64, untilEndUS int64) Grant {
	rate, capacity := l.Regional(sharePPM)
	g := Grant{Granted: granted, Tokens: tokens, Rate: rate, Capacity: capacity, SharePPM: sharePPM}
	switch {
	case granted != 0:
	case l.Fixed():
		g.RetryAfter = min(time.Duration(max(untilEndUS, 0))*time.Microsecond, MaxRetryAfter)
	default:
		g.RetryAfter = retryAfter(tokens, l.Cost, rate)
	}
	return g
}

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) == (b < 0) {
		q++
	}
	return q
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// validate checks a Limit against the contract.
func (l Limit) validate() error {
	switch {
	case !(l.Rate > 0) || math.IsInf(l.Rate, 0):
		return fmt.Errorf("%w: rate %v is not a positive finite number", ErrInvalid, l.Rate)
	case !(l.Burst > 0) || math.IsInf(l.Burst, 0):
		return fmt.Errorf("%w: burst %v is not a positive finite number", ErrInvalid, l.Burst)
	case l.Cost <= 0:
		return fmt.Errorf("%w: cost %d is not positive", ErrInvalid, l.Cost)
	case float64(l.Cost) > l.Burst:
		return fmt.Errorf("%w: cost %d is above burst %v", ErrInvalid, l.Cost, l.Burst)
	case l.InitialShare < 0 || l.InitialShare > region.PPM:
		return fmt.Errorf("%w: initial share %d ppm is outside [0, %d]", ErrInvalid, l.InitialShare, region.PPM)
	case l.Fixed() && !(0 < l.Window[0] && l.Window[0] < l.Window[1] && l.Window[1] < l.Window[2] && l.Window[2] < l.Window[3] && l.Window[3] <= maxEscrow):
		return fmt.Errorf("%w: fixed window boundaries %v are not increasing positive µs", ErrInvalid, l.Window)
	}
	return nil
}

// validateGrant checks one grant item. A want below the cost is invalid:
// grants are whole multiples of the cost, so it could never be granted.
func validateGrant(r GrantRequest) error {
	if err := validateKey(r.Key); err != nil {
		return err
	}
	if err := r.Limit.validate(); err != nil {
		return fmt.Errorf("key %q: %w", r.Key, err)
	}
	switch {
	case r.Want <= 0:
		return fmt.Errorf("key %q: %w: want %d is not positive", r.Key, ErrInvalid, r.Want)
	case r.Want < r.Limit.Cost:
		return fmt.Errorf("key %q: %w: want %d is below cost %d", r.Key, ErrInvalid, r.Want, r.Limit.Cost)
	case r.MaxShare < 0 || r.MaxShare > region.PPM:
		return fmt.Errorf("key %q: %w: max share %d ppm is outside [0, %d]", r.Key, ErrInvalid, r.MaxShare, region.PPM)
	case r.MaxShare > 0 && r.Limit.Fixed():
		return fmt.Errorf("key %q: %w: a max share for a fixed window", r.Key, ErrInvalid)
	case r.Raise != nil:
		return validateRaise(r)
	}
	return nil
}

// validateRaise checks a grant's Raise.
func validateRaise(r GrantRequest) error {
	u := r.Raise
	switch {
	case r.Limit.Fixed():
		return fmt.Errorf("key %q: %w: a raise carried by the grant of a fixed window", r.Key, ErrInvalid)
	case r.MaxShare > 0:
		return fmt.Errorf("key %q: %w: a raise and a max share in one grant", r.Key, ErrInvalid)
	case len(u.Steps) == 0:
		return fmt.Errorf("key %q: %w: a raise without steps", r.Key, ErrInvalid)
	case u.Gen > maxEscrow:
		return fmt.Errorf("key %q: %w: generation %d is above 2^53", r.Key, ErrInvalid, u.Gen)
	case u.Received < 0 || u.Received > maxEscrow:
		return fmt.Errorf("key %q: %w: received tokens %d are outside [0, 2^53]", r.Key, ErrInvalid, u.Received)
	}
	return validateSteps(r.Key, u.Steps)
}

// validateSteps checks a raise's or a share update's steps.
func validateSteps(key string, steps []ShareStep) error {
	if len(steps) > MaxRaiseSteps {
		return fmt.Errorf("key %q: %w: %d share steps, above %d", key, ErrInvalid, len(steps), MaxRaiseSteps)
	}
	for i, st := range steps {
		switch {
		case st.SharePPM <= 0 || st.SharePPM > region.PPM:
			return fmt.Errorf("key %q: %w: stepped share %d ppm is outside (0, %d]", key, ErrInvalid, st.SharePPM, region.PPM)
		case st.Age < 0 || st.Age > MaxRaiseAge:
			return fmt.Errorf("key %q: %w: share step age %v is outside [0, %v]", key, ErrInvalid, st.Age, MaxRaiseAge)
		case i > 0 && st.Age > steps[i-1].Age:
			return fmt.Errorf("key %q: %w: share steps not oldest first (%v after %v)", key, ErrInvalid, st.Age, steps[i-1].Age)
		}
	}
	return nil
}

func validateReturn(r ReturnRequest) error {
	if err := validateKey(r.Key); err != nil {
		return err
	}
	if err := r.Limit.validate(); err != nil {
		return fmt.Errorf("key %q: %w", r.Key, err)
	}
	if r.Tokens <= 0 {
		return fmt.Errorf("key %q: %w: returned tokens %d are not positive", r.Key, ErrInvalid, r.Tokens)
	}
	return nil
}

func validateShare(u ShareUpdate) error {
	if err := validateKey(u.Key); err != nil {
		return err
	}
	if err := u.Limit.validate(); err != nil {
		return fmt.Errorf("key %q: %w", u.Key, err)
	}
	switch {
	case u.SharePPM < 0 || u.SharePPM > region.PPM:
		return fmt.Errorf("key %q: %w: share %d ppm is outside [0, %d]", u.Key, ErrInvalid, u.SharePPM, region.PPM)
	case u.Gen > maxEscrow:
		return fmt.Errorf("key %q: %w: generation %d is above 2^53", u.Key, ErrInvalid, u.Gen)
	case u.Received < 0 || u.Received > maxEscrow:
		return fmt.Errorf("key %q: %w: received tokens %d are outside [0, 2^53]", u.Key, ErrInvalid, u.Received)
	case u.Window < 0 || u.Window > maxEscrow || (u.Window != 0 && !u.Limit.Fixed()):
		return fmt.Errorf("key %q: %w: received tokens of window %d, for a limit that has none", u.Key, ErrInvalid, u.Window)
	case len(u.Steps) > 0 && u.Limit.Fixed():
		return fmt.Errorf("key %q: %w: share steps for a fixed window", u.Key, ErrInvalid)
	}
	return validateSteps(u.Key, u.Steps)
}

func validateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalid)
	}
	return nil
}

// validateAll checks every item of a Return or SetShares batch; those
// batches are all or nothing, so the first bad item rejects the call.
func validateAll[T any](items []T, check func(T) error) error {
	for i, it := range items {
		if err := check(it); err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
	}
	return nil
}
