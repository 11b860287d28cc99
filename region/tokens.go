package region

import (
	"math"
	"math/bits"
	"slices"
)

// This file holds the escrow of tokens (docs/DESIGN.md, "Tokens move with
// share"): the tokens a bucket holds above its new capacity when a region
// gives share go with the gift, under the same rule as shares. The giver's
// store takes them out of the bucket first (ShareChange.Released of a Lower
// write); Commit gives them with that epoch's gifts, in proportion to the
// share given and at most what the share holds in a full bucket (b × share),
// so that the tokens in flight never exceed what the share in flight could
// hold; the rest is dropped. A receiver's store credits only what was given
// to it, once (it keeps what it credited per generation, and every write
// carries the cumulative total), capped at its capacity. Counters only grow
// and merge by maximum, so no loss, delay, duplicate or reordering of
// reports creates tokens; a lost write or report loses them, which costs
// utilisation until the buckets refill.

// TokenScale is the exchange's unit of tokens: its counters and the store's
// escrow count thousandths of a token, so that buckets of a few tokens
// split among regions still move their balance.
const TokenScale = 1000

// received is Σ of the tokens peers gave us in the key's generation and
// its newest fixed window (0 for a token bucket): what our store must have
// credited.
func (ks *keyState) received() (sum, window int64) {
	window = slices.Max(ks.tokInWin())
	for k, v := range ks.tokIn() {
		if ks.tokInWin()[k] == window {
			sum += v
		}
	}
	return sum, window
}

// change is a write of share a for ks, carrying the tokens given to us.
func (ks *keyState) change(a int64) ShareChange {
	c := ShareChange{Key: ks.key, SharePPM: a, Gen: ks.gen}
	if ks.gen != 0 {
		c.Received, c.Window = ks.received()
	}
	return c
}

// creditPending reports whether peers gave us tokens our store has not
// confirmed crediting.
func (ks *keyState) creditPending() bool {
	sum, window := ks.received()
	return window > ks.tokCreditedWin || (window == ks.tokCreditedWin && sum > ks.tokCredited)
}

// Wrote takes the share writes the store confirmed: the tokens received
// that it has credited. Node calls it after every Effects.WriteShares.
// Released tokens count only for a plan's Lower entries (Commit); what a
// raise releases (a credit above the capacity) is dropped, as a full bucket
// drops its refill.
func (s *State) Wrote(cs []ShareChange) {
	for _, c := range cs {
		ks := s.byKey[c.Key]
		if ks != nil && c.Gen == ks.gen {
			ks.written = s.now
			s.touch(ks)
		}
		if ks == nil || c.Gen == 0 || c.Gen != ks.gen || c.Window < ks.tokCreditedWin {
			continue
		}
		if c.Window > ks.tokCreditedWin {
			ks.tokCredited, ks.tokCreditedWin = 0, c.Window
		}
		ks.tokCredited = max(ks.tokCredited, c.Received)
	}
}

// giveTokens gives the tokens our store released for ks, in the fixed
// window win (0 for a token bucket), with this epoch's gifts of share, in
// proportion to them, each at most the key's burst times the share given;
// the rest (and what a counter near its limit cannot take) is dropped. A
// newer window starts our row afresh; tokens of an older one are dropped.
func (s *State) giveTokens(ks *keyState, gifts []int64, released, win int64) {
	switch {
	case win < ks.tokWin:
		return
	case win > ks.tokWin:
		clear(ks.tok())
		ks.tokWin = win
	}
	var total uint64
	for _, g := range gifts {
		total += uint64(max(g, 0))
	}
	burst := s.cfg.Policy(ks.key).Burst
	if total == 0 || !(burst > 0) {
		return
	}
	for k, g := range gifts {
		if g <= 0 {
			continue
		}
		hi, lo := bits.Mul64(uint64(released), uint64(g))
		q, _ := bits.Div64(hi, lo, total) // released × g / total < released: no overflow
		holds := math.Floor(burst * TokenScale * float64(g) / PPM)
		t := min(float64(q), holds, float64(maxCounter-ks.tok()[k]))
		ks.tok()[k] += int64(t)
	}
}

// mergeTokens takes the tokens peer k says it gave us in our generation: a
// newer window replaces what k gave in an older one.
func (s *State) mergeTokens(ks *keyState, k int, e *KeyReport, myCol int) {
	v := tokensAt(e.Tokens, myCol)
	switch {
	case e.TokensWindow > ks.tokInWin()[k]:
		ks.tokIn()[k], ks.tokInWin()[k] = v, e.TokensWindow
	case e.TokensWindow == ks.tokInWin()[k] && v > ks.tokIn()[k]:
		ks.tokIn()[k] = v
	default:
		return
	}
	s.raised(ks)
}

// tokensAt is column c of a Tokens row, 0 for an empty row (all zero).
func tokensAt(v []int64, c int) int64 {
	if len(v) == 0 {
		return 0
	}
	return v[c]
}
