package sim

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// palette colours the regions' lines; the total and limits are black.
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff},
	{0xff, 0x7f, 0x0e, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff},
}

// writePlots draws admitted vs limit, shares per region and the worst
// window against the bound over time.
func writePlots(dir string, res *Result) error {
	if len(res.Series) == 0 {
		return nil
	}
	s := &res.Summary
	limit := res.limit // Σ L: with many keys only a scale mark
	total := func(f func(Sample) float64) plotter.XYs {
		xy := make(plotter.XYs, 0, len(res.Series))
		for _, smp := range res.Series {
			if y := f(smp); !math.IsNaN(y) {
				xy = append(xy, plotter.XY{X: smp.T, Y: y})
			}
		}
		return xy
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s (%s): admitted vs limit", s.Scenario, s.Algorithm)
	p.X.Label.Text, p.Y.Label.Text = "time (s)", "tokens / s"
	add := func(p *plot.Plot, name string, xy plotter.XYs, c color.Color, dashed bool) error {
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = c
		l.Width = vg.Points(1)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(name, l)
		return nil
	}
	black := color.RGBA{A: 0xff}
	grey := color.RGBA{0x88, 0x88, 0x88, 0xff}
	if err := add(p, "admitted", total(func(x Sample) float64 { return sum(x.Admitted) }), black, false); err != nil {
		return err
	}
	if err := add(p, "asked", total(func(x Sample) float64 { return sum(x.Asked) }), grey, true); err != nil {
		return err
	}
	if err := add(p, "limit L", total(func(Sample) float64 { return limit }), color.RGBA{0xd6, 0x27, 0x28, 0xff}, true); err != nil {
		return err
	}
	for r, name := range res.Regions {
		rr := r
		if err := add(p, name+" admitted", total(func(x Sample) float64 { return x.Admitted[rr] }), palette[r%len(palette)], false); err != nil {
			return err
		}
	}
	p.Legend.Top = true
	if err := p.Save(9*vg.Inch, 4*vg.Inch, filepath.Join(dir, "admitted.png")); err != nil {
		return fmt.Errorf("sim: %w", err)
	}

	p = plot.New()
	p.Title.Text = fmt.Sprintf("%s (%s): applied share of the first key", s.Scenario, s.Algorithm)
	p.X.Label.Text, p.Y.Label.Text = "time (s)", "share (%)"
	for r, name := range res.Regions {
		rr := r
		if err := add(p, name, total(func(x Sample) float64 { return float64(x.Share[rr]) / 1e4 }), palette[r%len(palette)], false); err != nil {
			return err
		}
	}
	p.Legend.Top = true
	if err := p.Save(9*vg.Inch, 4*vg.Inch, filepath.Join(dir, "shares.png")); err != nil {
		return fmt.Errorf("sim: %w", err)
	}

	p = plot.New()
	p.Title.Text = fmt.Sprintf("%s (%s): worst window vs the bound, (admitted − L·W) / B", s.Scenario, s.Algorithm)
	p.X.Label.Text, p.Y.Label.Text = "time (s)", "ratio (1 = bound)"
	for i, name := range []string{"W = 1s", "W = 10s", "W = 60s"} {
		ii := i
		if s.BoundTokens.Get(i) == nil || len(total(func(x Sample) float64 { return x.Ratio[ii] })) == 0 {
			continue
		}
		if err := add(p, name, total(func(x Sample) float64 { return x.Ratio[ii] }), palette[i%len(palette)], false); err != nil {
			return err
		}
	}
	if err := add(p, "bound", total(func(Sample) float64 { return 1 }), black, true); err != nil {
		return err
	}
	p.Legend.Top = true
	if err := p.Save(9*vg.Inch, 4*vg.Inch, filepath.Join(dir, "bound.png")); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	return nil
}
