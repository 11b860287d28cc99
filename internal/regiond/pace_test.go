package regiond

import "time"

// pace calls send every 10ms with the whole tokens that rate() tokens/s
// has made due since the last call that took them, until stop is closed:
// a call that returns false (it failed) leaves them due for the next.
func pace(stop <-chan struct{}, rate func() int64, send func(n int64) (taken bool)) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	var owed float64 // tokens due but not sent yet (fractions)
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			owed += float64(rate()) * now.Sub(last).Seconds()
			last = now
			if n := int64(owed); n > 0 && send(n) {
				owed -= float64(n)
			}
		}
	}
}
