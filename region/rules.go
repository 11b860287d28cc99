package region

import (
	"slices"
	"strings"
	"time"
)

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

// maxRules bounds a report's rule definitions, and maxRuleName a rule's
// name (policy's own bound); maxPolicyName bounds Report.Policy.
const (
	maxRules      = 4096
	maxRuleName   = 64
	maxPolicyName = 256
)

// PeerRule is one replica's definition of a rule, as its latest report
// gave it.
type PeerRule struct {
	Region, Replica string
	// Policy is the replica's Report.Policy: the policy it enforces.
	Policy string
	Def    RuleDef
}

// Disagreement is a global rule that a peer (another region, or another
// replica of ours) defines otherwise than we do: its keys are held
// fail-static, no gifts either way and no reclaim, until every replica
// heard agrees (docs/DESIGN.md, "Regions agree before they exchange").
type Disagreement struct {
	Rule string
	// Ours is our definition, under our policy Policy.
	Ours   RuleDef
	Policy string
	// Theirs are the other definitions, one per replica that holds one.
	Theirs []PeerRule
}

// checkRules validates a report's rule definitions.
func checkRules(r *Report) error {
	if len(r.Policy) > maxPolicyName || r.Policy == "" && len(r.Rules) > 0 || len(r.Rules) > maxRules {
		return badReport(r, "policy %q with %d rules", r.Policy, len(r.Rules))
	}
	var seen map[string]struct{}
	if len(r.Rules) > 1 {
		seen = make(map[string]struct{}, len(r.Rules))
	}
	for i := range r.Rules {
		d := &r.Rules[i]
		if d.Name == "" || len(d.Name) > maxRuleName || d.Limit <= 0 || d.Period <= 0 || d.Cost <= 0 || d.Burst < d.Cost {
			return badReport(r, "rule %d (%q): limit %d, period %s, burst %d, cost %d", i, d.Name, d.Limit, d.Period, d.Burst, d.Cost)
		}
		if seen != nil {
			if _, dup := seen[d.Name]; dup {
				return badReport(r, "rule %q defined twice", d.Name)
			}
			seen[d.Name] = struct{}{}
		}
	}
	return nil
}

// noteRules keeps the rule definitions of a report as its replica's.
func (rep *replica) noteRules(r *Report) {
	rep.policy = r.Policy
	rep.rules = append(rep.rules[:0], r.Rules...)
}

// agree recomputes, at an epoch, which rules a replica heard defines
// otherwise than we do. A region counts with its replicas heard within
// StaleAfter, or, when it has none, with the one it was last heard from:
// a silent region still enforces what it last said. A rule that a peer
// does not define at all (nor holds as global) is no disagreement: the
// peer admits nothing for it. When the set changes, keys at rest wake.
func (s *State) agree(now time.Time) {
	version, own := "", []RuleDef(nil)
	if s.cfg.Rules != nil {
		version, own = s.cfg.Rules()
	}
	if version != s.ownPolicy || len(own) != len(s.ownRules) {
		s.ownPolicy = version
		clear(s.ownRules)
		if s.ownRules == nil {
			s.ownRules = make(map[string]RuleDef, len(own))
		}
		for _, d := range own {
			s.ownRules[d.Name] = d
		}
	}
	var found map[string]*Disagreement
	if len(s.ownRules) == 0 { // no global rule of ours to disagree on
		if len(s.disagree) > 0 {
			s.disagree = nil
			s.disagreeGen++
		}
		return
	}
	if len(s.agreeLatest) != s.n {
		s.agreeLatest, s.agreeRecent = make([]int, s.n), make([]bool, s.n)
	}
	latest, recent := s.agreeLatest, s.agreeRecent // per region: its replica heard last, and heard lately
	for k := range latest {
		latest[k], recent[k] = -1, false
	}
	for i := range s.replicas {
		r := &s.replicas[i]
		if !r.live {
			continue
		}
		if now.Sub(r.lastHeard) <= s.cfg.StaleAfter {
			recent[r.region] = true
		}
		if j := latest[r.region]; j < 0 || r.lastHeard.After(s.replicas[j].lastHeard) {
			latest[r.region] = i
		}
	}
	for i := range s.replicas {
		r := &s.replicas[i]
		if !r.live || r.policy == "" {
			continue
		}
		if recent[r.region] && now.Sub(r.lastHeard) > s.cfg.StaleAfter || !recent[r.region] && latest[r.region] != i {
			continue
		}
		for _, d := range r.rules {
			ours, ok := s.ownRules[d.Name]
			if !ok || ours.Fingerprint == d.Fingerprint {
				continue
			}
			if found == nil {
				found = make(map[string]*Disagreement)
			}
			dg := found[d.Name]
			if dg == nil {
				dg = &Disagreement{Rule: d.Name, Ours: ours, Policy: s.ownPolicy}
				found[d.Name] = dg
			}
			dg.Theirs = append(dg.Theirs, PeerRule{Region: s.cfg.Regions[r.region], Replica: r.name, Policy: r.policy, Def: d})
		}
	}
	if sameDisagreements(s.disagree, found) {
		return
	}
	s.disagree = found
	s.disagreeGen++
}

// sameDisagreements reports whether a and b hold the same rules with the
// same definitions from the same replicas.
func sameDisagreements(a, b map[string]*Disagreement) bool {
	if len(a) != len(b) {
		return false
	}
	for name, x := range a {
		y, ok := b[name]
		if !ok || x.Ours != y.Ours || x.Policy != y.Policy || !slices.Equal(x.Theirs, y.Theirs) {
			return false
		}
	}
	return true
}

// held reports whether a key of rule pol.Rule is held for a disagreement.
func (s *State) held(pol KeyPolicy) bool {
	if len(s.disagree) == 0 || pol.Rule == "" {
		return false
	}
	_, ok := s.disagree[pol.Rule]
	return ok
}

// DisagreementGen is the counter Disagreements returns, without the copy:
// callers that follow the disagreements read them again only when it moved.
func (s *State) DisagreementGen() uint64 { return s.disagreeGen }

// Disagreements returns the rules held for a disagreement at the latest
// Epoch, sorted by rule, and a counter that changes whenever they do.
func (s *State) Disagreements() ([]Disagreement, uint64) {
	out := make([]Disagreement, 0, len(s.disagree))
	for _, d := range s.disagree {
		c := *d
		c.Theirs = slices.Clone(d.Theirs)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Disagreement) int { return strings.Compare(a.Rule, b.Rule) })
	return out, s.disagreeGen
}
