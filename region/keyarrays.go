package region

// This file holds a key's per-region arrays: views of one pointer-free
// allocation (keyState.ints), laid out by the constants below: the int64
// rows, then the uint64 ones (gens), then the float64 ones (flts), the
// latter two viewed in place as their own type. A million keys' states are
// most of regiond's heap; as separate slices they were some twenty pointers
// each for the garbage collector to follow, and as three they were three
// objects to mark and three places for an epoch to miss in cache. With
// three regions a key is now two objects, 512 + 704 bytes (keyState, its
// peers' tallies inside; the arrays' 648 bytes), where it was five, 512 +
// 448 + 128 + 96 + 64.

import "unsafe"

// Offsets in keyState.ints, in units of n (rows and taken are n×n each).
const (
	offBases = iota
	offIn
	offInTaken
	offRefund
	offUnclaim
	offShares
	offAck
	offAckTkn
	offInTakenStored
	offTok
	offTokIn
	offTokInWin
	intRows // per-region rows after the two n×n ones
)

// Offsets in keyState.gens and keyState.flts, in units of n.
const (
	offRowGen = iota
	offCur
	offSeen
	offSettled
	offBorn
	genRows
)

const (
	offEwma = iota
	offMissed
	offRunBase
	offRestX
	fltRows
)

func intsLen(n int) int { return 2*n*n + intRows*n }
func gensLen(n int) int { return genRows * n }
func fltsLen(n int) int { return fltRows * n }

// arraysLen is the length of keyState.ints: the three parts.
func arraysLen(n int) int { return intsLen(n) + gensLen(n) + fltsLen(n) }

// regions is n, the number of regions.
func (ks *keyState) regions() int { return int(ks.n) }

// flts is the float64 part of ks.ints, in place (for tests that compare
// all of it).
func (ks *keyState) flts() []float64 {
	n := ks.regions()
	o, l := intsLen(n)+gensLen(n), fltsLen(n)
	v := ks.ints[o : o+l : o+l]
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(v))), l)
}

// row returns per-region row r of ints.
func (ks *keyState) intRow(r int) []int64 {
	n := ks.regions()
	o := 2*n*n + r*n
	return ks.ints[o : o+n : o+n]
}

func (ks *keyState) genRow(r int) []uint64 {
	n := ks.regions()
	o := intsLen(n) + r*n
	return unsafe.Slice((*uint64)(unsafe.Pointer(&ks.ints[o : o+n][0])), n)
}

func (ks *keyState) fltRow(r int) []float64 {
	n := ks.regions()
	o := intsLen(n) + gensLen(n) + r*n
	return unsafe.Slice((*float64)(unsafe.Pointer(&ks.ints[o : o+n][0])), n)
}

// rows is n×n: rows()[k*n+j] = G[k][j] as last reported by k (our own row
// is ours).
func (ks *keyState) rows() []int64 {
	n := ks.regions()
	return ks.ints[0 : n*n : n*n]
}

// taken is n×n: R[k][j], share k reclaimed from silent j.
func (ks *keyState) taken() []int64 {
	n := ks.regions()
	return ks.ints[n*n : 2*n*n : 2*n*n]
}

// bases: the base of k in rowGen()[k].
func (ks *keyState) bases() []int64 { return ks.intRow(offBases) }

// in: G[k][self] in gen, the gifts we applied (survives k's row moving on).
func (ks *keyState) in() []int64 { return ks.intRow(offIn) }

// inTaken: R[k][self] in gen.
func (ks *keyState) inTaken() []int64 { return ks.intRow(offInTaken) }

// refund: gifts we took back from k, which left gen without applying them.
func (ks *keyState) refund() []int64 { return ks.intRow(offRefund) }

// unclaim: reclaims from k we gave up, as k left gen without applying them.
func (ks *keyState) unclaim() []int64 { return ks.intRow(offUnclaim) }

// shares: k's last reported applied share.
func (ks *keyState) shares() []int64 { return ks.intRow(offShares) }

// ack: G[self][k] that k acknowledged applying, in gen.
func (ks *keyState) ack() []int64 { return ks.intRow(offAck) }

// ackTkn: R[self][k] that k acknowledged applying, in gen.
func (ks *keyState) ackTkn() []int64 { return ks.intRow(offAckTkn) }

// inTakenStored is inTaken as far as our stored share reflects it: what we
// acknowledge. A reclaimer keeps an acknowledged reclaim when it changes
// generation, so we must not acknowledge one the store has not applied yet.
func (ks *keyState) inTakenStored() []int64 { return ks.intRow(offInTakenStored) }

// tok, tokIn and tokInWin are the tokens escrowed with share (keyState.tokWin).
func (ks *keyState) tok() []int64      { return ks.intRow(offTok) }
func (ks *keyState) tokIn() []int64    { return ks.intRow(offTokIn) }
func (ks *keyState) tokInWin() []int64 { return ks.intRow(offTokInWin) }

// rowGen: the generation of k's row in rows().
func (ks *keyState) rowGen() []uint64 { return ks.genRow(offRowGen) }

// cur: the generation k listed the key with in its latest exchange report
// (0: none).
func (ks *keyState) cur() []uint64 { return ks.genRow(offCur) }

// seen: the epoch of k's latest exchange report that listed the key.
func (ks *keyState) seen() []uint64 { return ks.genRow(offSeen) }

// settled: the newest generation of k's exit records we settled against.
func (ks *keyState) settled() []uint64 { return ks.genRow(offSettled) }

// born: State.exchEpoch when we started tracking the key.
func (ks *keyState) born() []uint64 { return ks.genRow(offBorn) }

// ewma: each region's smoothed demand.
func (ks *keyState) ewma() []float64 { return ks.fltRow(offEwma) }

// missed is, per region, the requests its smoothed demand expected in the
// epochs since its last request, counted at the demand it had when they
// stopped (runBase): enough of them missed, the demand left.
func (ks *keyState) missed() []float64  { return ks.fltRow(offMissed) }
func (ks *keyState) runBase() []float64 { return ks.fltRow(offRunBase) }

// restX: per region, the demand it saw when it came to rest.
func (ks *keyState) restX() []float64 { return ks.fltRow(offRestX) }
