package exchange

import (
	"testing"
	"time"
)

// TestSiblingsHeard: a replica hears another replica of its region while
// that one publishes, and stops within StaleAfter of its going; a region of
// one replica hears none.
func TestSiblingsHeard(t *testing.T) {
	c := newCluster(t, 50*time.Millisecond, "eu", "us")
	us := c.start("us", "us-0")
	eu0, eu1 := c.start("eu", "eu-0"), c.start("eu", "eu-1")
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s", what)
			}
			time.Sleep(c.period / 5) // polling interval, not a wait for an event
		}
	}
	waitFor("eu's replicas hear each other", func() bool { return eu0.x.SiblingsHeard() && eu1.x.SiblingsHeard() })
	if us.x.SiblingsHeard() {
		t.Fatal("us, one replica, hears a sibling")
	}
	_ = eu1.x.Close()
	waitFor("eu-0 stops hearing eu-1", func() bool { return !eu0.x.SiblingsHeard() })
}
