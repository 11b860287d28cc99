package sim

// proxyFault starts a crash_proxies or disconnect_proxies fault at t, or
// cuts every proxy of a region whose regiond is unreachable or restarting
// (their streams break).
func (w *world) proxyFault(i int, r *regiond, t int64) {
	if w.px == nil || !r.proxied() {
		return
	}
	f := &w.sc.Faults[i]
	switch f.Kind {
	case "crash_proxies":
		for n := f.Proxies; n > 0 && len(r.px.live) > 0; n-- {
			j := w.px.rnd.IntN(len(r.px.live))
			p := r.px.live[j]
			r.px.live = append(r.px.live[:j], r.px.live[j+1:]...)
			p.alive = false
			w.disconnect(p)
			for ki, b := range p.buckets {
				if b != nil {
					w.closeFallback(b, ki, t)
				}
			}
		}
		if f.For > 0 {
			w.ev.push(event{at: t + int64(f.For), kind: evHeal, fault: i})
		}
		return
	case "disconnect_proxies":
		var conn []*proxySim
		for _, p := range r.px.live {
			if p.stream != nil {
				conn = append(conn, p)
			}
		}
		for n := f.Proxies; n > 0 && len(conn) > 0; n-- {
			j := w.px.rnd.IntN(len(conn))
			p := conn[j]
			conn = append(conn[:j], conn[j+1:]...)
			w.disconnect(p)
			r.px.cut[i] = append(r.px.cut[i], p)
		}
		w.ev.push(event{at: t + int64(f.For), kind: evHeal, fault: i})
		return
	}
	for _, p := range r.px.live { // unreachable, restart: every stream
		if p.stream != nil {
			w.disconnect(p)
			r.px.cut[i] = append(r.px.cut[i], p)
		}
	}
}

// proxyHeal ends fault i at t: crashed proxies' replacements start cold,
// cut ones reconnect.
func (w *world) proxyHeal(i int, r *regiond, t int64) {
	if w.px == nil || !r.proxied() {
		return
	}
	f := &w.sc.Faults[i]
	if f.Kind == "crash_proxies" {
		for range f.Proxies {
			if err := w.addProxy(r, t); err != nil {
				w.fail(err)
				return
			}
		}
		return
	}
	for _, p := range r.px.cut[i] {
		if p.alive && p.stream == nil {
			if err := w.connect(p, t); err != nil {
				w.fail(err)
				return
			}
		}
	}
	delete(r.px.cut, i)
}
