package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
)

func TestTicksAreRound(t *testing.T) {
	got := ticks(0, 110, 8)
	want := []float64{0, 20, 40, 60, 80, 100}
	if len(got) != len(want) {
		t.Fatalf("ticks(0,110) = %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ticks(0,110) = %v, want %v", got, want)
		}
	}
	if got := ticks(0, 0.9, 6); got[1] != 0.2 {
		t.Fatalf("ticks(0,0.9) = %v", got)
	}
}

// Decimation keeps every column's extremes: a single spike among a million
// points survives.
func TestDecimateKeepsPeaks(t *testing.T) {
	n := 1_000_000
	xs, ys := make([]float64, n), make([]float64, n)
	for i := range xs {
		xs[i] = float64(i)
		ys[i] = math.Sin(float64(i) / 1e4)
	}
	ys[777_777] = 50
	pts := decimate(xs, ys, 0, float64(n), 500)
	if len(pts) > 8*500 {
		t.Fatalf("%d values after decimation to 500 columns", len(pts))
	}
	found := false
	for k := 1; k < len(pts); k += 2 {
		if pts[k] == 50 {
			found = true
		}
	}
	if !found {
		t.Fatal("spike lost by decimation")
	}
}

// The SVG is well-formed XML, escapes text, and is deterministic.
func TestFigureSVG(t *testing.T) {
	fig := Figure{Title: "Two flows <paper>", Panels: []Panel{
		{Title: "Rates", XLabel: "time (ms)", YLabel: "Gb/s", HBands: []Band{{19, 21, "20 ± 1"}}, VLines: []float64{90},
			Series: []Series{{Name: "flow 1 & co", X: []float64{0, 50, 110}, Y: []float64{40, 20, 20}},
				{Name: "fluid", X: []float64{0, 110}, Y: []float64{20, 20}, Dashed: true}}},
		{Title: "Queue", XLabel: "time (ms)", YLabel: "KB", Series: []Series{{Name: "q", X: []float64{0, 1, 2}, Y: []float64{0, math.NaN(), 3}}}},
	}}
	var a, b bytes.Buffer
	if err := fig.WriteSVG(&a); err != nil {
		t.Fatal(err)
	}
	if err := fig.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("SVG output differs between two renders")
	}
	d := xml.NewDecoder(bytes.NewReader(a.Bytes()))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v", err)
		}
	}
	s := a.String()
	for _, want := range []string{"&lt;paper&gt;", "flow 1 &amp; co", "stroke-dasharray", "<path d=\"M"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

// A log y axis draws log10 of the data with ticks at 1, 2 and 5 times the
// powers of ten in range; labelled x ticks replace the numeric ones.
func TestLogAxisAndXTicks(t *testing.T) {
	f := Figure{Panels: []Panel{{YLog: true, XTicks: []Tick{{V: 1, Label: "10K"}, {V: 2, Label: "1M"}},
		Series: []Series{{Name: "p95", X: []float64{0.5, 1.5, 2.5}, Y: []float64{1, 12, 0}}}}}}
	var b bytes.Buffer
	if err := f.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	for _, want := range []string{">10K<", ">1M<", ">1<", ">2<", ">5<", ">10<", ">20<", ">50<", ">100<"} {
		if !strings.Contains(s, want) {
			t.Errorf("log panel lacks the label %s", want)
		}
	}
	if strings.Contains(s, ">200<") || strings.Contains(s, ">0.5<") {
		t.Error("ticks outside the data's decades")
	}
	// The non-positive point is left out, not drawn at -Inf.
	if strings.Contains(s, "Inf") || strings.Contains(s, "NaN") {
		t.Error("non-finite coordinates in the SVG")
	}
}
