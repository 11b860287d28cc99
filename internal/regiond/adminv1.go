package regiond

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/ration-dev/ration/internal/adminapi"
	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
	"github.com/ration-dev/ration/region"
)

// The admin API (internal/adminapi): a key, the top keys and the status of
// this regiond, as JSON, behind the admin token.

// adminTimeout bounds what one admin request waits for: the store, and the
// exchange's loop, which may be in the middle of an epoch's store calls.
const adminTimeout = 2 * time.Second

// maxTop is the most keys one /v1/top answers.
const maxTop = 1000

// peeker is the store as the admin API reads a bucket: lease.MemoryStore
// and lease.RedisStore.
type peeker interface {
	Peek(ctx context.Context, key string, l lease.Limit) (lease.BucketState, bool, error)
}

func (d *Daemon) adminV1(mux *http.ServeMux) {
	// {storekey...}: the key escaped as one segment, or its slash left as is.
	mux.Handle("GET "+adminapi.PathKey+"{storekey...}", d.v1Auth(d.serveKey))
	mux.Handle("GET "+adminapi.PathTop, d.v1Auth(d.serveTop))
	mux.Handle("GET "+adminapi.PathStatus, d.v1Auth(d.serveStatus))
}

// v1Auth serves f to callers with the admin token (all, without one) and
// answers the others 401 with an adminapi.Error.
func (d *Daemon) v1Auth(f func(w http.ResponseWriter, r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.adminToken != nil && !d.adminToken.Allows(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ration"`)
			writeError(w, http.StatusUnauthorized, "unauthorized: send Authorization: Bearer <the admin token>")
			return
		}
		f(w, r)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // store keys and messages as they are
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, format string, args ...any) {
	writeJSON(w, code, adminapi.Error{Error: fmt.Sprintf(format, args...)})
}

// serveKey is GET /v1/keys/{storekey}.
func (d *Daemon) serveKey(w http.ResponseWriter, r *http.Request) {
	storeKey := r.PathValue("storekey")
	ruleName, key, ok := policy.SplitStoreKey(storeKey)
	switch {
	case !ok || ruleName == "" || key == "":
		writeError(w, http.StatusBadRequest, "malformed key %q: want RULE/KEY, escaped as one path segment (per-tenant%%2Facme)", storeKey)
		return
	case len(key) > 1024:
		writeError(w, http.StatusBadRequest, "key of %d bytes: the lease API accepts at most 1024", len(key))
		return
	}
	pol := d.svc.Policy()
	if pol == nil {
		writeError(w, http.StatusServiceUnavailable, "no policy loaded yet")
		return
	}
	rule := pol.Rule(ruleName)
	if rule == nil {
		writeError(w, http.StatusNotFound, "unknown rule %q in the enforced policy %s", ruleName, pol.Version())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	now := time.Now()
	out := adminapi.Key{Region: d.cfg.Region, Replica: d.cfg.Replica, StoreKey: storeKey, Rule: ruleName, Key: key,
		Scope: string(policy.ScopeGlobal), Algorithm: string(policy.AlgorithmTokenBucket), Limit: rule.Limit, Period: rule.Period.Seconds()}
	if rule.Scope == policy.ScopeRegion {
		out.Scope = string(policy.ScopeRegion)
	}
	if rule.FixedWindow() {
		out.Algorithm = string(policy.AlgorithmFixedWindow)
	}
	var notes []string
	st, held, err := d.peeker().Peek(ctx, storeKey, service.Limit(rule, d.initial, now))
	switch {
	case err != nil:
		writeError(w, http.StatusBadGateway, "store: %v", err)
		return
	case held:
		out.Bucket = &adminapi.Bucket{Tokens: st.Tokens, Rate: st.Rate, Capacity: st.Capacity, Share: float64(st.SharePPM) / region.PPM}
	default:
		notes = append(notes, "the store holds no bucket for the key (never leased here, or expired)")
	}
	if note := d.keyExchange(ctx, &out, rule, now); note != "" {
		notes = append(notes, note)
	}
	rc := d.svc.Recent(now, storeKey)
	out.Recent = adminapi.Recent{Window: rc.Window.Seconds(), Admitted: rc.Admitted, Denied: rc.Denied, Tracked: rc.Tracked}
	out.DryFor = d.svc.DryFor(now, storeKey).Seconds()
	for i, n := range notes {
		if i > 0 {
			out.Note += "; "
		}
		out.Note += n
	}
	writeJSON(w, http.StatusOK, out)
}

// keyExchange fills the key's exchange state, or says why there is none.
func (d *Daemon) keyExchange(ctx context.Context, out *adminapi.Key, rule *policy.Rule, now time.Time) string {
	x := d.obs.x.Load()
	switch {
	case rule.Scope == policy.ScopeRegion:
		return "" // nothing to exchange
	case x == nil:
		return "no exchange: this region holds the whole quota"
	}
	ks, err := x.Inspect(ctx, out.StoreKey)
	switch {
	case err != nil:
		return fmt.Sprintf("exchange: %v", err)
	case !ks.Holder:
		return "this replica does not run the region's exchange: ask the replica that does (ration status shows the holder)"
	}
	v := ks.View
	ex := &adminapi.Exchange{Resting: v.Resting, Held: v.Held}
	for _, r := range v.Regions {
		rs := adminapi.RegionShare{Region: r.Region, Self: r.Self, Share: float64(r.SharePPM) / region.PPM,
			Demand: r.Demand / ks.Period.Seconds(), ReportAge: age(now, r.Heard)}
		if r.Self {
			rs.ReportAge = 0
		}
		ex.Regions = append(ex.Regions, rs)
	}
	out.Exchange = ex
	if !v.Known {
		return "the exchange holds no state for the key (no demand lately): every region holds its initial share"
	}
	return ""
}

// age is the seconds from at to now, -1 for a zero at (never).
func age(now, at time.Time) float64 {
	if at.IsZero() {
		return -1
	}
	return max(now.Sub(at).Seconds(), 0)
}

func (d *Daemon) peeker() peeker {
	if d.mem != nil {
		return d.mem
	}
	return d.redis
}

// serveTop is GET /v1/top?rule=R&by=denied|demand&n=N.
func (d *Daemon) serveTop(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rule, by := q.Get("rule"), q.Get("by")
	if by == "" {
		by = "denied"
	}
	if by != "denied" && by != "demand" {
		writeError(w, http.StatusBadRequest, "by=%q: denied or demand", by)
		return
	}
	n := 10
	if s := q.Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > maxTop {
			writeError(w, http.StatusBadRequest, "n=%q: a number from 1 to %d", s, maxTop)
			return
		}
		n = v
	}
	if rule != "" {
		if pol := d.svc.Policy(); pol == nil || pol.Rule(rule) == nil {
			writeError(w, http.StatusNotFound, "unknown rule %q in the enforced policy", rule)
			return
		}
	}
	keys, window := d.svc.Top(time.Now(), rule, by == "denied", n)
	out := adminapi.Top{Region: d.cfg.Region, Replica: d.cfg.Replica, Rule: rule, By: by, Window: window.Seconds(), Keys: []adminapi.TopKey{}}
	for _, k := range keys {
		_, key, _ := policy.SplitStoreKey(k.StoreKey)
		out.Keys = append(out.Keys, adminapi.TopKey{StoreKey: k.StoreKey, Rule: k.Rule, Key: key, Count: k.Count, Error: k.Error,
			Admitted: k.Admitted, Denied: k.Denied})
	}
	writeJSON(w, http.StatusOK, out)
}

// serveStatus is GET /v1/status.
func (d *Daemon) serveStatus(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	out := d.status(ctx)
	writeJSON(w, http.StatusOK, out)
}

func (d *Daemon) status(ctx context.Context) adminapi.Status {
	now := time.Now()
	out := adminapi.Status{Region: d.cfg.Region, Replica: d.cfg.Replica, Version: buildVersion(),
		Uptime: now.Sub(d.started).Seconds(), Store: adminapi.Store{Kind: d.storeName(), OK: true}, Agents: d.svc.Agents()}
	if err := d.Ready(ctx); err != nil {
		out.NotReady = err.Error()
	} else {
		out.Ready = true
	}
	if err := d.pingStore(ctx); err != nil {
		out.Store.OK, out.Store.Error = false, err.Error()
	}
	out.Policy = adminapi.Policy{Source: d.policyName(), Revision: d.rev.Load(), Stricter: d.pol.Stricter()}
	if pol := d.svc.Policy(); pol != nil {
		out.Policy.Version, out.Policy.Rules = pol.Version(), len(pol.Rules())
	}
	x := d.obs.x.Load()
	if x == nil {
		return out
	}
	ex := &adminapi.ExchangeStatus{Period: d.cfg.SyncPeriod.Seconds(), Peers: []adminapi.Peer{}}
	out.Exchange = ex
	st, err := x.Status(ctx)
	if err != nil {
		// The loop did not answer in time: what is published without it.
		ex.Holder = x.Leader()
		for r, at := range x.PeersHeard() {
			ex.Peers = append(ex.Peers, adminapi.Peer{Region: r, Heard: !at.IsZero(), ReportAge: age(now, at)})
		}
		d.log.Warn("admin: the exchange's status", "err", err)
		return out
	}
	ex.Holder, ex.Epoch, ex.Keys, ex.Resting, ex.Disagreements = st.Holder, st.Epoch, st.Keys, st.Resting, st.Disagreements
	for _, p := range st.Peers {
		ex.Peers = append(ex.Peers, adminapi.Peer{Region: p.Region, Heard: !p.Heard.IsZero(), ReportAge: age(now, p.Heard), Stale: p.Stale, Policy: p.Policy})
	}
	return out
}

// buildVersion is the module version regiond was built from, when known.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return ""
}
