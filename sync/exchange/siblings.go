package exchange

import "time"

// SiblingsHeard reports whether a report of another replica of this region
// arrived within region.Config.StaleAfter: agents may then lease through a
// replica whose grants this one never sees (the share keeper of regiond,
// lease/service/shares.go, then keeps no raise). Safe for concurrent use.
func (x *Exchanger) SiblingsHeard() bool {
	at := x.siblingAt.Load()
	return at != 0 && x.cfg.Clock().Sub(time.Unix(0, at)) <= x.node.Config().StaleAfter
}
