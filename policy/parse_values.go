package policy

import (
	"time"

	"github.com/ration-dev/ration/internal/yamlfield"
)

// tokens decodes a token count: an integer in [1, MaxTokens].
func (p *parser) tokens(f yamlfield.Field, path string) (int64, bool) {
	v, ok := p.Int(f, path)
	switch {
	case !ok:
		return 0, false
	case v <= 0:
		p.Errorf(f.Key.Line, path, "must be > 0")
		return 0, false
	case v > MaxTokens:
		p.Errorf(f.Key.Line, path, "must be at most %d (2^53)", int64(MaxTokens))
		return 0, false
	}
	return v, true
}

// duration decodes a Go duration string of at most limit, which maxText
// spells for messages. A bare 0 is accepted as zero; other bare numbers are
// errors, since their unit would be a guess.
func (p *parser) duration(f yamlfield.Field, path string, limit time.Duration, maxText string) (time.Duration, bool) {
	d, ok := p.Duration(f, path)
	if ok && d > limit {
		p.Errorf(f.Key.Line, path, "must be at most %s", maxText)
		return 0, false
	}
	return d, ok
}
