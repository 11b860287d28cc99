// Package policy is ration's rule model: which requests a rule limits, what
// forms the rate-limited key, and the algorithm, limit, period, burst, cost,
// scope and failure mode that apply to it (DESIGN.md, "Policy"). A rule is
// a token bucket or a fixed window; Rule.Window and Rule.Boundaries cut time
// into a fixed window's calendar-aligned windows, in the rule's time zone.
//
// Rules are data in YAML. Parse validates a whole document before anything
// is applied and reports every problem with its file, line and field; a bad
// document never produces a Set. A Set is immutable and safe for concurrent
// use; its Match method is the agent's hot path and does not allocate.
// Watcher keeps the current Set of a file, reloading it when the file changes
// or on demand, and never replaces a good Set with a bad file.
//
// To start:
//
//	set, err := policy.LoadFile("rules.yaml")
//	...
//	matched := set.Match(buf[:0], descriptors)
//	for _, r := range matched {
//		key = r.AppendKey(key[:0], descriptors)
//	}
package policy
