package region

import "time"

// RuleDef is one global rule's definition as a region enforces it: what
// the regions must agree on before they move share of the rule's keys
// (docs/DESIGN.md, "Regions agree before they exchange"). Reports carry the
// sender's definitions (Report.Rules); a key whose rule a live peer defines
// with another Fingerprint is held (Disagreements).
type RuleDef struct {
	// Name is the rule's name (KeyPolicy.Rule of its keys).
	Name string
	// Fingerprint hashes every field of the definition that changes what
	// the rule admits (policy.Rule.Fingerprint): equal fingerprints, equal
	// definitions.
	Fingerprint uint64
	// FixedWindow is true for a fixed window, false for a token bucket.
	FixedWindow bool
	// Limit tokens per Period; Burst is the bucket's capacity and Cost the
	// tokens one request takes.
	Limit  int64
	Period time.Duration
	Burst  int64
	Cost   int64
}
