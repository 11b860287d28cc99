package sim

// openTerm is the excess a fault adds to the bound of some keys, as spans
// whose end is not known when the fault starts: it is open until the fault
// has ended and over reports that what it let through has stopped; then
// the spans end tail later (tokens still in leases, calls still failing).
type openTerm struct {
	fault  int
	region int // the region at fault (-1: none in particular)
	spans  []termSpan
	healed bool
	over   func() bool
	tail   int64
}

// termSpan is one key's span in the meter; local marks the emergency
// bucket terms that new agents widen (fallbackAgents).
type termSpan struct {
	key, span int
	local     bool
}

// addTerm appends f to key ki's bound and to o.
func (w *world) addTerm(o *openTerm, ki int, f faultSpan, local bool) {
	km := &w.m.keys[ki]
	km.faults = append(km.faults, f)
	o.spans = append(o.spans, termSpan{key: ki, span: len(km.faults) - 1, local: local})
}

// healTerms notes that fault has ended.
func (w *world) healTerms(fault int) {
	for i := range w.terms {
		if w.terms[i].fault == fault {
			w.terms[i].healed = true
		}
	}
}

// checkTerms closes, at t, the terms of ended faults whose excess is over.
// A span that would end before it began never had anything to count.
func (w *world) checkTerms(t int64) {
	out := w.terms[:0]
	for _, o := range w.terms {
		if !o.healed || !o.over() {
			out = append(out, o)
			continue
		}
		for _, s := range o.spans {
			f := &w.m.keys[s.key].faults[s.span]
			f.to = t + o.tail
			if f.to <= f.from {
				f.tokens, f.rate = 0, 0
			}
		}
	}
	w.terms = out
}
