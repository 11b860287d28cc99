package leasev1

import "time"

// DefaultLeaseTTL is τ's default: how long a lease may be spent, measured
// from when its request was sent. The lease service grants leases of this
// TTL unless configured otherwise, and an agent assumes it for a grant that
// carries none.
const DefaultLeaseTTL = 100 * time.Millisecond
