package httplimit

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/lease"
	"github.com/ration-dev/ration/lease/agent"
	"github.com/ration-dev/ration/lease/agent/internal/leaseserver"
	"github.com/ration-dev/ration/lease/service"
	"github.com/ration-dev/ration/policy"
)

// TestHeadersFixedWindow writes the headers and the problem body of fixed
// windows' decisions: w is the current window's real length, t,
// X-RateLimit-Reset and Retry-After the seconds to its end (rounded up), and
// the body names the window ("per day", "per 1m0s window").
func TestHeadersFixedWindow(t *testing.T) {
	day := agent.Window{Calendar: policy.CalendarDay, Length: 24 * time.Hour}
	for _, tt := range []struct {
		name   string
		d      agent.Decision
		want   map[string]string
		detail string // of the problem body; "" for an allowed request
	}{{
		name: "a day of 25 hours, allowed",
		d:    agent.Decision{Allowed: true, Limit: 1000, Period: 25 * time.Hour, Window: day, Remaining: 998, Reset: 11*time.Hour + 300*time.Millisecond, Rule: "daily", Path: agent.PathLease},
		want: map[string]string{
			"Ratelimit-Policy": `"daily";q=1000;w=90000`, "Ratelimit": `"daily";r=998;t=39601`,
			"X-Ratelimit-Limit": "1000", "X-Ratelimit-Remaining": "998", "X-Ratelimit-Reset": "39601", "Retry-After": "",
		},
	}, {
		name: "a day, exhausted",
		d:    agent.Decision{Limit: 1000, Period: 24 * time.Hour, Window: day, Reset: 8*time.Hour + 30*time.Minute, RetryAfter: 8*time.Hour + 30*time.Minute, Rule: "daily", Path: agent.PathDenyCache},
		want: map[string]string{
			"Ratelimit-Policy": `"daily";q=1000;w=86400`, "Ratelimit": `"daily";r=0;t=30600`,
			"X-Ratelimit-Limit": "1000", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "30600", "Retry-After": "30600",
		},
		detail: `Rate limit "daily" exceeded: 1000 per day.`,
	}, {
		name: "a minute window, exhausted",
		d:    agent.Decision{Limit: 100, Period: time.Minute, Window: agent.Window{Length: time.Minute}, Reset: 12500 * time.Millisecond, RetryAfter: 12500 * time.Millisecond, Rule: "per-minute", Path: agent.PathLease},
		want: map[string]string{
			"Ratelimit-Policy": `"per-minute";q=100;w=60`, "Ratelimit": `"per-minute";r=0;t=13`,
			"X-Ratelimit-Limit": "100", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "13", "Retry-After": "13",
		},
		detail: `Rate limit "per-minute" exceeded: 100 per 1m0s window.`,
	}, {
		name: "February, exhausted",
		d:    agent.Decision{Limit: 50000, Period: 28 * 24 * time.Hour, Window: agent.Window{Calendar: policy.CalendarMonth, Length: policy.NominalMonth}, Reset: 36 * time.Hour, RetryAfter: 36 * time.Hour, Rule: "monthly", Path: agent.PathLease},
		want: map[string]string{
			"Ratelimit-Policy": `"monthly";q=50000;w=2419200`, "Ratelimit": `"monthly";r=0;t=129600`,
			"X-Ratelimit-Limit": "50000", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "129600", "Retry-After": "129600",
		},
		detail: `Rate limit "monthly" exceeded: 50000 per month.`,
	}, {
		name: "a token bucket, as before",
		d:    agent.Decision{Limit: 3, Period: time.Minute, Reset: time.Minute, RetryAfter: 20 * time.Second, Rule: "per-key", Path: agent.PathLease},
		want: map[string]string{
			"Ratelimit-Policy": `"per-key";q=3;w=60`, "Ratelimit": `"per-key";r=0;t=60`,
			"X-Ratelimit-Limit": "3", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "60", "Retry-After": "20",
		},
		detail: `Rate limit "per-key" exceeded: 3 per 1m0s.`,
	}} {
		t.Run(tt.name, func(t *testing.T) {
			mw, err := New(Config{Agent: fixedDecider(tt.d)})
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil))
			got := map[string]string{}
			for h := range tt.want {
				got[h] = rec.Header().Get(h)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
			if tt.detail == "" {
				return
			}
			var p Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
				t.Fatalf("body %q: %v", rec.Body.Bytes(), err)
			}
			if p.Detail != tt.detail || p.RetryAfter != int64(seconds(tt.d.RetryAfter)) {
				t.Errorf("problem detail %q, retry_after %d; want %q, %d", p.Detail, p.RetryAfter, tt.detail, seconds(tt.d.RetryAfter))
			}
		})
	}
}

// fixedDecider answers every request with one decision.
type fixedDecider agent.Decision

func (f fixedDecider) Allow(context.Context, []policy.Descriptor, int64) agent.Decision {
	return agent.Decision(f)
}

// TestFixedWindowHeadersEndToEnd serves a daily quota in Europe/Berlin on
// the day Berlin falls back (25 hours), from a real agent and region whose
// clocks read 12:00 CET, twelve hours before the day's end, and then a
// second into the next day.
func TestFixedWindowHeadersEndToEnd(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 10, 25, 11, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	const doc = `
rules:
  - name: daily
    key: [api_key]
    limit: 2
    period: day
    algorithm: fixed_window
    time_zone: Europe/Berlin
`
	r := leaseserver.Start(t, doc, service.Config{Clock: clock, Store: lease.NewMemoryStore(lease.MemoryConfig{Clock: clock})})
	a := startAgent(t, agent.Config{Target: r.Addr, Logger: leaseserver.Quiet(), RoundTripTimeout: time.Second, Clock: clock})
	mw, err := New(Config{Agent: a, Extractor: Extractor{APIKeyHeader: "X-API-Key"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	t.Cleanup(srv.Close)
	const left = "43200" // 12 hours, in seconds
	for i, want := range []map[string]string{
		{"Ratelimit-Policy": `"daily";q=2;w=90000`, "Ratelimit": `"daily";r=1;t=` + left, "X-Ratelimit-Reset": left, "Retry-After": ""},
		{"Ratelimit-Policy": `"daily";q=2;w=90000`, "Ratelimit": `"daily";r=0;t=` + left, "X-Ratelimit-Reset": left, "Retry-After": ""},
		{"Ratelimit-Policy": `"daily";q=2;w=90000`, "Ratelimit": `"daily";r=0;t=` + left, "X-Ratelimit-Reset": left, "Retry-After": left},
	} {
		resp, body := get(t, srv.URL+"/x", "X-API-Key", "k1")
		got := map[string]string{}
		for h := range want {
			got[h] = resp.Header.Get(h)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("request %d: headers (-want +got):\n%s", i, diff)
		}
		if i < 2 {
			continue
		}
		var p Problem
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		if resp.StatusCode != http.StatusTooManyRequests || p.Detail != `Rate limit "daily" exceeded: 2 per day.` || p.RetryAfter != 43200 {
			t.Errorf("got %d with %+v, want 429 saying 2 per day, retry after 43200", resp.StatusCode, p)
		}
	}
	// A second into the next day, of 24 hours.
	now.Store(time.Date(2026, 10, 25, 23, 0, 1, 0, time.UTC).UnixNano())
	resp, _ := get(t, srv.URL+"/x", "X-API-Key", "k1")
	if got := resp.Header.Get("RateLimit-Policy") + " " + resp.Header.Get("RateLimit"); resp.StatusCode != 200 || got != `"daily";q=2;w=86400 "daily";r=1;t=86399` {
		t.Errorf("the next day got %d with %s, want 200 with a window of 86400s ending in 86399s", resp.StatusCode, got)
	}
}
