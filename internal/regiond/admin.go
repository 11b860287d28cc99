package regiond

import (
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
	return mux
}
