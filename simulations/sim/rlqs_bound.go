package sim

// proxyBound is what proxies add to key k's B (docs/RLQS.md, "The bound
// the server controls"): the refills pre-debited ahead, L·(TTL + Slack),
// and the tokens standing in the proxies' token buckets, half a fill of
// their rates, about L × fill/2, plus one token (a cost) of rounding per
// proxy's bucket; and the banks, tokens saved for upsizes that may be
// spent later than TTL + Slack after their debit, at most what the
// buckets' targets need fresh: the same two terms again. The fallback's
// part is added per stretch (fallbackDecide).
func (w *world) proxyBound(k *simKey) float64 {
	if w.px == nil {
		return 0
	}
	c := &w.px.cfg
	held := k.rate*(c.TTL+c.Slack).Seconds() + k.rate*c.FillInterval.Seconds()/2 + float64(int64(w.px.initial)*k.cost)
	return 2 * held
}

// agentsServe reports whether some region's requests go to agents.
func (w *world) agentsServe() bool {
	for _, r := range w.rs {
		if !r.proxied() {
			return true
		}
	}
	return false
}

// proxyPaths adds the proxies' decisions to paths and returns their count.
func (w *world) proxyPaths(paths map[string]int64) int64 {
	if w.px == nil {
		return 0
	}
	var n int64
	for p := range w.px.dec {
		for o, c := range w.px.dec[p] {
			if c > 0 {
				paths[proxyPathNames[p]+[]string{"_denied", "_allowed"}[o]] += c
				n += c
			}
		}
	}
	return n
}

// RLQSSummary is what the proxies' assignments held, checked every 100 ms
// against the assumptions of the bound's terms (docs/RLQS.md): the worst
// Σ max_tokens of one key's assignments in force ÷ the term for them (L ×
// fill_interval / 2 + one cost per proxy), and the worst Σ tokens_per_fill
// ÷ L per fill_interval, which L·(TTL + Slack) takes as at most 1.
//
// BankMax is the worst Σ of one key's banks (store tokens debited and not
// yet in an assignment, docs/RLQS.md "The bank") ÷ L × 1 s.
type RLQSSummary struct {
	MaxTokensRatioMax     float64 `json:"max_tokens_ratio_max"`
	TokensPerFillRatioMax float64 `json:"tokens_per_fill_ratio_max"`
	BankRatioMax          float64 `json:"bank_ratio_max"`
}

// proxyCheck notes, at t, the assignments in force against the bound's
// assumptions.
func (w *world) proxyCheck(t int64) {
	if w.px == nil {
		return
	}
	c := &w.px.cfg
	for ki := range w.keys {
		k := &w.keys[ki]
		var maxSum, fillSum, bank float64
		for _, r := range w.rs {
			if !r.proxied() {
				continue
			}
			for _, p := range r.px.live {
				if p.stream != nil {
					bank += float64(p.stream.core.Banked(k.storeKey))
				}
			}
			for _, p := range r.px.live {
				if b := p.buckets[ki]; b != nil && b.tb != nil && b.assigned && t < b.expires {
					maxSum += float64(int64(b.tb.GetMaxTokens()) * k.cost)
					fillSum += float64(int64(b.tb.GetTokensPerFill().GetValue())*k.cost) / b.tb.GetFillInterval().AsDuration().Seconds()
				}
			}
		}
		term := k.rate*c.FillInterval.Seconds()/2 + float64(int64(w.px.initial)*k.cost)
		w.px.maxRatio = max(w.px.maxRatio, maxSum/term)
		w.px.fillRatio = max(w.px.fillRatio, fillSum/k.rate)
		w.px.bankRatio = max(w.px.bankRatio, bank/k.rate)
	}
}

func (w *world) proxySummary() *RLQSSummary {
	if w.px == nil {
		return nil
	}
	return &RLQSSummary{MaxTokensRatioMax: round4(w.px.maxRatio), TokensPerFillRatioMax: round4(w.px.fillRatio),
		BankRatioMax: round4(w.px.bankRatio)}
}
