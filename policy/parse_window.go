package policy

import (
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/internal/yamlfield"
)

// ruleAlgorithm decodes a rule's algorithm and time_zone. They are decoded
// before the tokens because a fixed window's period, burst and cost follow
// other rules than a token bucket's.
func (p *parser) ruleAlgorithm(fs yamlfield.Fields, path string, r *Rule) {
	if f, ok := fs.Get("algorithm"); ok {
		if s, ok := p.Enum(f, path+".algorithm", string(AlgorithmTokenBucket), string(AlgorithmFixedWindow)); ok {
			r.Algorithm = Algorithm(s)
		}
	}
	if r.FixedWindow() {
		r.Location = time.UTC
	}
	f, ok := fs.Get("time_zone")
	if !ok {
		return
	}
	field := path + ".time_zone"
	name, ok := p.Str(f, field)
	switch {
	case !ok:
	case !r.FixedWindow():
		p.Errorf(f.Key.Line, field, "only applies to algorithm: fixed_window (a token bucket has no windows to align)")
	case name == "":
		p.Errorf(f.Key.Line, field, "must not be empty (omit it for UTC)")
	case name == "Local":
		p.Errorf(f.Key.Line, field, `must be an IANA time zone name such as "Europe/Berlin" ("Local" differs from machine to machine)`)
	default:
		if loc := p.zone(name); loc != nil {
			r.Location = loc
		} else {
			p.Errorf(f.Key.Line, field, `unknown time zone %q (want an IANA name such as "Europe/Berlin" or "UTC")`, yamlfield.Clip(name))
		}
	}
}

// zone loads the named time zone once per document; nil when it is unknown.
func (p *parser) zone(name string) *time.Location {
	if loc, ok := p.zones[name]; ok {
		return loc
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		loc = nil
	}
	if p.zones == nil {
		p.zones = make(map[string]*time.Location)
	}
	p.zones[name] = loc
	return loc
}

// calendars maps the period words to their calendar periods.
var calendars = map[string]Calendar{"day": CalendarDay, "week": CalendarWeek, "month": CalendarMonth}

// nominal returns the length Rate assumes for a calendar period.
func (c Calendar) nominal() time.Duration {
	switch c {
	case CalendarWeek:
		return NominalWeek
	case CalendarMonth:
		return NominalMonth
	}
	return NominalDay
}

// period decodes a rule's period. A token bucket's is a duration of at most
// MaxPeriod. A fixed window's is a whole number of seconds that divides a
// day (so that windows align to local midnight; 24h is day), or one of the
// calendar words day, week and month.
func (p *parser) period(f yamlfield.Field, path string, r *Rule) {
	isStr := f.Val.Kind == yaml.ScalarNode && f.Val.ShortTag() == "!!str"
	if c, ok := calendars[f.Val.Value]; ok && isStr {
		if !r.FixedWindow() {
			p.Errorf(f.Key.Line, path, `%q is a calendar period, which only applies to algorithm: fixed_window (a token bucket's period is a duration such as "1m" or "720h")`, f.Val.Value)
			return
		}
		r.Calendar, r.Period = c, c.nominal()
		return
	}
	if !r.FixedWindow() {
		if d, ok := p.duration(f, path, MaxPeriod, "744h (31 days)"); ok && d <= 0 {
			p.Errorf(f.Key.Line, path, "must be > 0")
		} else if ok {
			r.Period = d
		}
		return
	}
	if _, ok := yamlfield.ParseDuration(f.Val); !ok && isStr {
		p.Errorf(f.Key.Line, path, `must be a Go duration such as "1m" or "1h", or one of "day", "week", "month" (got %q)`, yamlfield.Clip(f.Val.Value))
		return
	}
	d, ok := p.Duration(f, path)
	switch {
	case !ok:
	case d <= 0:
		p.Errorf(f.Key.Line, path, "must be > 0")
	case d%time.Second != 0 || NominalDay%d != 0:
		p.Errorf(f.Key.Line, path, "must divide a day into windows of whole seconds, such as 1s, 10s, 1m, 5m, 15m, 1h, 2h, 6h, 12h or 24h; or be day, week or month (got %s)", yamlfield.Clip(f.Val.Value))
	case d == NominalDay:
		r.Calendar, r.Period = CalendarDay, d
	default:
		r.Period = d
	}
}
