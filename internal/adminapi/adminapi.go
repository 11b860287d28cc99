// Package adminapi is the JSON that regiond's admin listener serves to
// operators and that the ration CLI reads (ration inspect, top, status): one
// definition for both ends. Paths are under /v1 and sit behind the admin
// token like /metrics; every answer names the region and replica that gave
// it, because an operator asks several regions at once.
//
// Durations are seconds as float64 (json has no duration); a negative age
// means "never". Shares are fractions of the global quota (0..1), rates are
// tokens per second.
package adminapi

// Paths of the admin API.
const (
	// PathKey is GET /v1/keys/{storekey}: Key. The store key is the rule's
	// name, a slash and the key as the rule forms it ("per-tenant/acme");
	// the path escapes it as one segment.
	PathKey = "/v1/keys/"
	// PathTop is GET /v1/top?rule=R&by=denied|demand&n=N: Top.
	PathTop = "/v1/top"
	// PathStatus is GET /v1/status: Status.
	PathStatus = "/v1/status"
)

// Error is the body of any answer that is not 200.
type Error struct {
	Error string `json:"error"`
}

// Key is what one region knows of one key right now.
type Key struct {
	Region  string `json:"region"`
	Replica string `json:"replica"`
	// StoreKey is the key as the allocator and the exchange name it; Rule
	// and Key its two parts.
	StoreKey string `json:"store_key"`
	Rule     string `json:"rule"`
	Key      string `json:"key"`
	// Scope is "global" or "region"; Algorithm "token_bucket" or
	// "fixed_window"; Limit and Period (seconds) the rule's quota as
	// enforced here (the stricter one while regions disagree).
	Scope     string  `json:"scope"`
	Algorithm string  `json:"algorithm"`
	Limit     int64   `json:"limit"`
	Period    float64 `json:"period_seconds"`
	// Bucket is the regional bucket as the store holds it now; nil when the
	// store has no bucket for the key (never leased, or expired).
	Bucket *Bucket `json:"bucket,omitempty"`
	// Exchange is the key's state in the exchange, for a global rule on the
	// replica that runs the region's exchange; nil otherwise (Note says
	// why).
	Exchange *Exchange `json:"exchange,omitempty"`
	// Recent counts what agents reported for the key over the last
	// Window seconds, from the bounded summaries that also serve Top (so a
	// key too small to be tracked shows zeros, with Tracked false).
	Recent Recent `json:"recent"`
	// DryFor is the seconds until the region expects the bucket to grant
	// again when it remembers the key as dry (0 when not).
	DryFor float64 `json:"dry_for_seconds,omitempty"`
	Note   string  `json:"note,omitempty"`
}

// Bucket is a regional bucket as the store holds it.
type Bucket struct {
	Tokens   float64 `json:"tokens"`
	Rate     float64 `json:"rate"`
	Capacity float64 `json:"capacity"`
	// Share is the share of the global quota the store applied to this
	// region's bucket (1 for a region rule).
	Share float64 `json:"share"`
}

// Exchange is one global key as the region's exchange sees it.
type Exchange struct {
	// Regions lists every region of the deployment, this one included
	// (Self), with its share and smoothed demand as this region last heard
	// them.
	Regions []RegionShare `json:"regions"`
	// Resting is true when the key planned nothing for two epochs running
	// (docs/DESIGN.md, "Keys at rest"); Held when regions disagree on its
	// rule and its shares stay where they are.
	Resting bool `json:"resting"`
	Held    bool `json:"held"`
}

// RegionShare is one region's part of a global key.
type RegionShare struct {
	Region string  `json:"region"`
	Self   bool    `json:"self,omitempty"`
	Share  float64 `json:"share"`
	// Demand is the region's smoothed demand for the key (tokens/s), as
	// its latest report said (ours: as we computed it).
	Demand float64 `json:"demand"`
	// ReportAge is the seconds since this region last heard a report from
	// that region (0 for Self; negative if never).
	ReportAge float64 `json:"report_age_seconds"`
}

// Recent is admitted and denied counts over a recent window.
type Recent struct {
	Window   float64 `json:"window_seconds"`
	Admitted uint64  `json:"admitted"`
	Denied   uint64  `json:"denied"`
	Tracked  bool    `json:"tracked"`
}

// Top is the keys with the most denied tokens, or the most demand, over the
// recent window, per rule (or over every rule), as a bounded summary
// estimates them.
type Top struct {
	Region  string   `json:"region"`
	Replica string   `json:"replica"`
	Rule    string   `json:"rule,omitempty"`
	By      string   `json:"by"` // "denied" or "demand"
	Window  float64  `json:"window_seconds"`
	Keys    []TopKey `json:"keys"`
}

// TopKey is one entry of Top. Count is the summary's estimate, which may
// exceed the truth by at most Error.
type TopKey struct {
	StoreKey string `json:"store_key"`
	Rule     string `json:"rule"`
	Key      string `json:"key"`
	Count    uint64 `json:"count"`
	Error    uint64 `json:"error"`
	// Admitted and Denied are the key's recent counts (as in Key.Recent).
	Admitted uint64 `json:"admitted"`
	Denied   uint64 `json:"denied"`
}

// Status is the health of one regiond and of its view of the fleet.
type Status struct {
	Region  string `json:"region"`
	Replica string `json:"replica"`
	Version string `json:"version,omitempty"` // the build, when known
	// Ready mirrors /readyz; NotReady says why not.
	Ready    bool    `json:"ready"`
	NotReady string  `json:"not_ready,omitempty"`
	Uptime   float64 `json:"uptime_seconds"`
	Store    Store   `json:"store"`
	Policy   Policy  `json:"policy"`
	// Exchange is nil for a single region (no exchange).
	Exchange *ExchangeStatus `json:"exchange,omitempty"`
	// Agents is the number of agents that leased within the last minutes.
	Agents int `json:"agents"`
}

// Store is the allocator the region leases from.
type Store struct {
	Kind  string `json:"kind"` // "redis" or "memory"
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// Policy is what the region enforces.
type Policy struct {
	Source   string   `json:"source"`
	Revision uint64   `json:"revision"`
	Version  string   `json:"version"`
	Rules    int      `json:"rules"`
	Stricter []string `json:"stricter,omitempty"`
}

// ExchangeStatus is the exchange as this replica sees it.
type ExchangeStatus struct {
	// Holder is true when this replica runs the region's exchange.
	Holder bool `json:"holder"`
	// Period is the sync period in seconds; Epoch the latest epoch run.
	Period float64 `json:"period_seconds"`
	Epoch  uint64  `json:"epoch"`
	// Keys is the number of global keys the exchange holds state for, and
	// Resting how many of them rest.
	Keys    int `json:"keys"`
	Resting int `json:"resting"`
	// Peers lists every other region of the deployment.
	Peers []Peer `json:"peers"`
	// Disagreements names the rules held because a peer defines them
	// otherwise.
	Disagreements []string `json:"disagreements,omitempty"`
}

// Peer is another region as this one hears it.
type Peer struct {
	Region string `json:"region"`
	Heard  bool   `json:"heard"`
	// ReportAge is the seconds since its latest complete report (negative:
	// never heard).
	ReportAge float64 `json:"report_age_seconds"`
	// Stale is true when it is older than the exchange's staleness limit,
	// so the region plans without it.
	Stale bool `json:"stale"`
	// Policy is the policy name its latest report carried.
	Policy string `json:"policy,omitempty"`
}
