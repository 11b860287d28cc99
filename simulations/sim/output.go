package sim

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
)

// WriteFiles writes a run's outputs to dir: summary.json, series.csv and
// the PNG plots (admitted.png, shares.png, bound.png).
func WriteFiles(dir string, res *Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), res.Summary.JSON(), 0o644); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	if err := writeCSV(filepath.Join(dir, "series.csv"), res); err != nil {
		return err
	}
	return writePlots(dir, res)
}

// writeCSV writes the time series: one row per sample, with the totals and
// then, per region, tokens/s asked and admitted and the first key's share.
func writeCSV(path string, res *Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	w := bufio.NewWriter(f)
	if err := WriteCSV(w, res); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("sim: %w", err)
	}
	return f.Close()
}

// WriteCSV writes the time series as CSV.
func WriteCSV(w *bufio.Writer, res *Result) error {
	w.WriteString("t_s,asked_per_s,admitted_per_s,ratio_1s,ratio_10s,ratio_60s")
	for _, r := range res.Regions {
		fmt.Fprintf(w, ",%s_asked_per_s,%s_admitted_per_s,%s_share_ppm", r, r, r)
	}
	w.WriteByte('\n')
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	for _, s := range res.Series {
		var asked, adm float64
		for i := range s.Asked {
			asked += s.Asked[i]
			adm += s.Admitted[i]
		}
		w.WriteString(num(round4(s.T)) + "," + num(round4(asked)) + "," + num(round4(adm)))
		for _, r := range s.Ratio {
			w.WriteByte(',')
			if !math.IsNaN(r) {
				w.WriteString(num(round4(r)))
			}
		}
		for i := range s.Asked {
			w.WriteString("," + num(round4(s.Asked[i])) + "," + num(round4(s.Admitted[i])) + "," + strconv.FormatInt(s.Share[i], 10))
		}
		if err := w.WriteByte('\n'); err != nil {
			return fmt.Errorf("sim: %w", err)
		}
	}
	return nil
}
