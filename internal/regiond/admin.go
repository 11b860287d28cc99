package regiond

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func (d *Daemon) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := d.Ready(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	// Probes stay open; what reveals the region's state takes the admin
	// token when there is one.
	mux.Handle("GET /metrics", d.adminToken.Wrap(promhttp.HandlerFor(d.cfg.Registry, promhttp.HandlerOpts{Registry: d.cfg.Registry})))
	mux.Handle("GET /policy", d.adminToken.Wrap(http.HandlerFunc(d.servePolicy)))
	d.adminV1(mux)
	return d.adm.count(mux)
}

// policyStatus is GET /policy: what this regiond enforces.
type policyStatus struct {
	Source string `json:"source"`
	// Revision is the policy store's revision applied (0 without it).
	Revision uint64 `json:"revision"`
	// Name is how reports name the loaded policy; Version its version.
	Name    string `json:"name"`
	Version string `json:"version"`
	// Enforced is the version enforced: Version, or another while rules
	// are enforced stricter (Stricter names them) or a revision is staged.
	Enforced string   `json:"enforced_version"`
	Rules    []string `json:"rules"`
	Stricter []string `json:"stricter,omitempty"`
}

func (d *Daemon) servePolicy(w http.ResponseWriter, _ *http.Request) {
	base, enforced := d.pol.Base(), d.svc.Policy()
	st := policyStatus{Source: d.policyName(), Revision: d.rev.Load(), Name: d.pol.Name(), Version: base.Version(),
		Enforced: enforced.Version(), Stricter: d.pol.Stricter()}
	for _, r := range enforced.Rules() {
		st.Rules = append(st.Rules, r.Name)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(st)
}
