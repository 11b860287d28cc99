package agent

import (
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSlotsSpendExpiryFromSendTime(t *testing.T) {
	var s slots
	// A lease sent at 0 with a TTL of 100ms, answered at 30ms.
	if d := s.install(30*ms, 100*ms, 5); d != 0 {
		t.Fatalf("install dropped %d, want 0", d)
	}
	steps := []struct {
		now  int64
		n    int64
		want bool
	}{
		{40 * ms, 2, true},
		{99 * ms, 3, true},
		{99 * ms, 1, false}, // empty
	}
	for i, st := range steps {
		if _, _, _, ok := s.spend(st.now, st.n); ok != st.want {
			t.Errorf("step %d: spend(%d, %d) got %v, want %v", i, st.now, st.n, ok, st.want)
		}
	}
	// The lease ends 100ms after it was sent, not after the reply arrived.
	s.install(100*ms, 200*ms, 1) // fills the empty slot
	s.install(150*ms, 250*ms, 4)
	if _, _, _, ok := s.spend(199*ms, 5); ok {
		t.Error("spent 5 tokens split over two leases; a spend comes from one lease")
	}
	if _, _, _, ok := s.spend(200*ms, 4); !ok {
		t.Error("could not spend the second lease at 200ms")
	}
	if got := s.live(200 * ms); got != 0 {
		t.Errorf("live at 200ms got %d, want 0 (first lease expired, second spent)", got)
	}
	if got := s.collect(200 * ms); got != 1 {
		t.Errorf("collect got %d dropped, want the 1 expired token", got)
	}
}

func TestSlotsRenewalNeverExtendsOldTokens(t *testing.T) {
	var s slots
	s.install(0, 100*ms, 10)
	s.install(50*ms, 150*ms, 10) // renewal while the first still holds 10
	if got := s.live(99 * ms); got != 20 {
		t.Fatalf("live at 99ms got %d, want 20", got)
	}
	if got := s.live(100 * ms); got != 10 {
		t.Errorf("live at 100ms got %d, want 10: the first lease's tokens must expire with it", got)
	}
	// A third grant while both hold live tokens joins the later lease,
	// keeping that lease's expiry.
	s.install(60*ms, 160*ms, 5)
	if got := s.live(100 * ms); got != 15 {
		t.Errorf("live at 100ms after a third grant got %d, want 15", got)
	}
	if got := s.live(150 * ms); got != 0 {
		t.Errorf("live at 150ms got %d, want 0", got)
	}
}

func TestSlotsPutBackOnlyIntoSameLease(t *testing.T) {
	var s slots
	s.install(0, 100*ms, 3)
	s.install(0, 200*ms, 5)
	i, w, _, ok := s.spend(10*ms, 3) // the earlier lease goes first
	if !ok {
		t.Fatal("spend failed")
	}
	if !s.putBack(i, w, 3) {
		t.Fatal("put back into the same lease failed")
	}
	i, w, _, _ = s.spend(10*ms, 3)
	// The first lease is now empty, so a new grant replaces it under a new
	// generation.
	s.install(20*ms, 120*ms, 7)
	if s.putBack(i, w, 3) {
		t.Error("put back into a replaced lease succeeded; tokens would move into a newer lease")
	}
	if got := s.live(20 * ms); got != 12 {
		t.Errorf("live got %d, want 12", got)
	}
}

func TestSlotsDrain(t *testing.T) {
	var s slots
	s.install(0, 100*ms, 4)
	s.install(0, 200*ms, 6)
	s.spend(1*ms, 4) // the earlier lease goes first
	s.install(0, 50*ms, 0)
	live, dropped := s.drain(150 * ms)
	if diff := cmp.Diff([2]int64{6, 0}, [2]int64{live, dropped}); diff != "" {
		t.Errorf("drain (-want +got):\n%s", diff)
	}
}

// slotModel is a naive list of at most two leases, kept as install keeps
// the slots, for TestSlotsMatchModel.
type slotModel []struct{ exp, n int64 }

func (m *slotModel) install(now, exp, n int64) {
	l := (*m)
	free := -1
	for i := range l {
		if l[i].exp <= now || l[i].n == 0 {
			if free < 0 || l[i].exp < l[free].exp {
				free = i
			}
		}
	}
	switch {
	case len(l) < 2: // slots start expired at 0, so a free one always exists
		*m = append(l, struct{ exp, n int64 }{exp, n})
	case free >= 0:
		l[free].exp, l[free].n = exp, n
	default:
		later := 0
		if l[1].exp > l[0].exp {
			later = 1
		}
		if l[later^1].n < n {
			l[later^1].exp, l[later^1].n = exp, n
		} else {
			l[later].exp = min(l[later].exp, exp)
			l[later].n += n
		}
	}
}

// spend takes n from the live lease expiring first that holds n.
func (m slotModel) spend(now, n int64) bool {
	best := -1
	for i, l := range m {
		if l.exp > now && l.n >= n && (best < 0 || l.exp < m[best].exp) {
			best = i
		}
	}
	if best >= 0 {
		m[best].n -= n
	}
	return best >= 0
}

func (m slotModel) live(now int64) int64 {
	var n int64
	for _, l := range m {
		if l.exp > now {
			n += l.n
		}
	}
	return n
}

// TestSlotsMatchModel drives slots with random operations and checks them
// against a naive list of leases.
func TestSlotsMatchModel(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	var s slots
	var model slotModel
	now := int64(0)
	for step := 0; step < 20000; step++ {
		now += rng.Int64N(10 * ms)
		if rng.IntN(3) == 0 {
			exp, n := now+50*ms+rng.Int64N(100*ms), rng.Int64N(20)
			s.install(now, exp, n)
			model.install(now, exp, n)
		} else {
			n := 1 + rng.Int64N(5)
			_, _, _, ok := s.spend(now, n)
			if want := model.spend(now, n); ok != want {
				t.Fatalf("seed %d step %d: spend(%d) got %v, want %v (model %v)", seed, step, n, ok, want, model)
			}
		}
		if got, want := s.live(now), model.live(now); got != want {
			t.Fatalf("seed %d step %d: live got %d, want %d", seed, step, got, want)
		}
	}
}

// TestRetireLeavesALeaseInstalledAtTheSameExpiry: a spend that finds its
// slot empty retires it (expiry 0); a writer that installs a new lease in
// that slot with the very same expiry between the spend's check and its
// retirement must keep its tokens spendable. The second spend's steps are
// spend's own, run one at a time with the writer between them.
func TestRetireLeavesALeaseInstalledAtTheSameExpiry(t *testing.T) {
	const now, exp, later = 10, 100, 200
	var s slots
	s.install(now, exp, 1)    // slot 0
	s.install(now, later, 10) // slot 1
	if i, _, _, ok := s.spend(now, 1); !ok || i != 0 {
		t.Fatalf("the first spend got slot %d, %v; want slot 0", i, ok)
	}
	// The second spend tries slot 0 first (it expires first) and fails.
	w := s.word[0].Add(-1 << genBits)
	if balance(w) >= 0 {
		t.Fatal("the second spend found a token in slot 0")
	}
	if !undoFailed(&s.word[0], &s.lost, w, 1) || !s.emptyIn(0, w) {
		t.Fatal("the second spend did not find slot 0 empty")
	}
	s.install(now, exp, 5) // the writer refills slot 0, at the same expiry
	s.retire(0, w, exp)    // the spend retires what it found empty
	if got := s.exp[0].Load(); got != exp {
		t.Errorf("slot 0's expiry got %d, want %d (the new lease's)", got, exp)
	}
	if got := s.live(now); got != 15 {
		t.Errorf("live tokens got %d, want 15 (5 new in slot 0, 10 in slot 1)", got)
	}
}

// TestSpendRetiresAnEmptySlot: a spend that fails on an empty slot retires
// it, so that later spends skip it.
func TestSpendRetiresAnEmptySlot(t *testing.T) {
	const now, exp, later = 10, 100, 200
	var s slots
	s.install(now, exp, 1)
	s.install(now, later, 10)
	s.spend(now, 1) // empties slot 0
	if _, _, _, ok := s.spend(now, 1); !ok {
		t.Fatal("the second spend failed; slot 1 holds 10")
	}
	if got := s.exp[0].Load(); got != 0 {
		t.Errorf("slot 0's expiry got %d, want 0 (retired)", got)
	}
}
