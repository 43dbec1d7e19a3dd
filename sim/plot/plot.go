package plot

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Series is one line.
type Series struct {
	Name   string
	X, Y   []float64
	Dashed bool
	// Color overrides the palette ("#rrggbb"); empty picks by index.
	Color string
}

// Panel is one chart (one pair of axes).
type Panel struct {
	Title, XLabel, YLabel string
	Series                []Series
	// YMin/YMax fix the y range when YFixed is set; otherwise it is
	// fitted to the data, starting at 0 for non-negative data.
	YFixed     bool
	YMin, YMax float64
	// XFixed fixes the x range to [XMin, XMax].
	XFixed     bool
	XMin, XMax float64
	Height     int // pixels; 0 = 260
	// HBands shades horizontal ranges, e.g. a target band.
	HBands []Band
	// VLines marks x positions, e.g. a measurement window.
	VLines []float64
	// XTicks, when set, replace the x axis's ticks by these labelled ones
	// (e.g. flow sizes at bucket positions).
	XTicks []Tick
	// YLog draws the y axis in log10 (positive data only; ticks at powers
	// of ten).
	YLog bool

	yTicks []Tick // set by drawLogPanel: labelled ticks of the log10 values
}

// Tick is an axis tick with its own label.
type Tick struct {
	V     float64
	Label string
}

// Band is a shaded horizontal range with a label.
type Band struct {
	Lo, Hi float64
	Label  string
}

// Figure stacks panels that share a width.
type Figure struct {
	Title  string
	Width  int // pixels; 0 = 720
	Panels []Panel
}

// Palette is Okabe–Ito's colour-blind-safe set, then Tableau's.
var Palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000",
	"#4E79A7", "#F28E2B", "#E15759", "#76B7B2", "#59A14F", "#EDC948", "#B07AA1", "#FF9DA7", "#9C755F", "#BAB0AC"}

const (
	marginL, marginR, marginT, marginB = 70, 150, 30, 48
	titleH                             = 28
)

// WriteSVG renders the figure.
func (f *Figure) WriteSVG(w io.Writer) error {
	bw := bufio.NewWriter(w)
	width := f.Width
	if width <= 0 {
		width = 720
	}
	total := 0
	if f.Title != "" {
		total += titleH
	}
	for i := range f.Panels {
		total += panelHeight(&f.Panels[i]) + marginT + marginB
	}
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		width, total, width, total)
	fmt.Fprintf(bw, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, total)
	y := 0
	if f.Title != "" {
		fmt.Fprintf(bw, `<text x="%d" y="20" text-anchor="middle" font-size="15" font-weight="bold">%s</text>`+"\n", width/2, esc(f.Title))
		y += titleH
	}
	for i := range f.Panels {
		p := &f.Panels[i]
		drawPanel(bw, p, 0, y, width)
		y += panelHeight(p) + marginT + marginB
	}
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}

func panelHeight(p *Panel) int {
	if p.Height > 0 {
		return p.Height
	}
	return 260
}

func drawPanel(w *bufio.Writer, p *Panel, ox, oy, width int) {
	h := panelHeight(p)
	x0, y0 := float64(ox+marginL), float64(oy+marginT)
	pw, ph := float64(width-marginL-marginR), float64(h)

	if p.YLog {
		drawLogPanel(w, p, ox, oy, width)
		return
	}
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		for i := range s.X {
			if i >= len(s.Y) || bad(s.X[i]) || bad(s.Y[i]) {
				continue
			}
			xmin, xmax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i])
			ymin, ymax = math.Min(ymin, s.Y[i]), math.Max(ymax, s.Y[i])
		}
	}
	if math.IsInf(xmin, 1) {
		xmin, xmax, ymin, ymax = 0, 1, 0, 1
	}
	for _, b := range p.HBands {
		ymax = math.Max(ymax, b.Hi)
	}
	if ymin >= 0 {
		ymin = 0
	}
	if p.XFixed {
		xmin, xmax = p.XMin, p.XMax
	}
	if p.YFixed {
		ymin, ymax = p.YMin, p.YMax
	} else {
		ymax += (ymax - ymin) * 0.05
	}
	if xmax <= xmin {
		xmax = xmin + 1
	}
	if ymax <= ymin {
		ymax = ymin + 1
	}
	xt := ticks(xmin, xmax, 8)
	yt := ticks(ymin, ymax, 6)
	if !p.YFixed && len(yt) > 0 && yt[len(yt)-1] < ymax {
		step := 1.0
		if len(yt) > 1 {
			step = yt[1] - yt[0]
		}
		ymax = yt[len(yt)-1] + step
		yt = append(yt, ymax)
	}
	sx := func(x float64) float64 { return x0 + (x-xmin)/(xmax-xmin)*pw }
	sy := func(y float64) float64 { return y0 + ph - (y-ymin)/(ymax-ymin)*ph }

	if p.Title != "" {
		fmt.Fprintf(w, `<text x="%s" y="%s" font-size="13" font-weight="bold">%s</text>`+"\n", f1(x0), f1(y0-10), esc(p.Title))
	}
	// Bands and grid under the data.
	for _, b := range p.HBands {
		lo, hi := math.Max(b.Lo, ymin), math.Min(b.Hi, ymax)
		if hi <= lo {
			continue
		}
		fmt.Fprintf(w, `<rect x="%s" y="%s" width="%s" height="%s" fill="#999999" fill-opacity="0.15"/>`+"\n",
			f1(x0), f1(sy(hi)), f1(pw), f1(sy(lo)-sy(hi)))
		if b.Label != "" {
			fmt.Fprintf(w, `<text x="%s" y="%s" font-size="10" fill="#555555" text-anchor="end">%s</text>`+"\n", f1(x0+pw-4), f1(sy(hi)-3), esc(b.Label))
		}
	}
	yticks := p.yTicks
	if len(yticks) == 0 {
		for _, t := range yt {
			yticks = append(yticks, Tick{V: t, Label: num(t)})
		}
	}
	for _, t := range yticks {
		fmt.Fprintf(w, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e5e5e5"/>`+"\n", f1(x0), f1(sy(t.V)), f1(x0+pw), f1(sy(t.V)))
		fmt.Fprintf(w, `<text x="%s" y="%s" text-anchor="end">%s</text>`+"\n", f1(x0-6), f1(sy(t.V)+4), esc(t.Label))
	}
	drawXTicks(w, p, xt, sx, y0, ph)
	for _, v := range p.VLines {
		if v < xmin || v > xmax {
			continue
		}
		fmt.Fprintf(w, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#777777" stroke-dasharray="2,3"/>`+"\n", f1(sx(v)), f1(y0), f1(sx(v)), f1(y0+ph))
	}
	// Data, clipped to the plot area.
	clip := fmt.Sprintf("c%d", oy)
	fmt.Fprintf(w, `<clipPath id="%s"><rect x="%s" y="%s" width="%s" height="%s"/></clipPath>`+"\n", clip, f1(x0), f1(y0), f1(pw), f1(ph))
	fmt.Fprintf(w, `<g clip-path="url(#%s)" fill="none" stroke-width="1.3" stroke-linejoin="round">`+"\n", clip)
	for i, s := range p.Series {
		pts := decimate(s.X, s.Y, xmin, xmax, int(pw))
		if len(pts) == 0 {
			continue
		}
		var b strings.Builder
		for k := 0; k < len(pts); k += 2 {
			if k == 0 {
				b.WriteByte('M')
			} else {
				b.WriteByte('L')
			}
			b.WriteString(f1(sx(pts[k])))
			b.WriteByte(',')
			b.WriteString(f1(sy(pts[k+1])))
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6,4"`
		}
		fmt.Fprintf(w, `<path d="%s" stroke="%s"%s/>`+"\n", b.String(), color(s, i), dash)
	}
	fmt.Fprintln(w, "</g>")
	// Axes and labels.
	fmt.Fprintf(w, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#333333"/>`+"\n", f1(x0), f1(y0), f1(pw), f1(ph))
	fmt.Fprintf(w, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", f1(x0+pw/2), f1(y0+ph+36), esc(p.XLabel))
	fmt.Fprintf(w, `<text transform="translate(%s,%s) rotate(-90)" text-anchor="middle">%s</text>`+"\n", f1(x0-50), f1(y0+ph/2), esc(p.YLabel))
	// Legend: one line per series, or a summary when there are too many.
	lx, ly := x0+pw+12, y0+8
	if len(p.Series) > 12 {
		fmt.Fprintf(w, `<text x="%s" y="%s">%d series</text>`+"\n", f1(lx), f1(ly+4), len(p.Series))
		return
	}
	for i, s := range p.Series {
		yy := ly + float64(i)*16
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6,4"`
		}
		fmt.Fprintf(w, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>`+"\n", f1(lx), f1(yy), f1(lx+20), f1(yy), color(s, i), dash)
		fmt.Fprintf(w, `<text x="%s" y="%s">%s</text>`+"\n", f1(lx+25), f1(yy+4), esc(s.Name))
	}
}

func color(s Series, i int) string {
	if s.Color != "" {
		return esc(s.Color)
	}
	return Palette[i%len(Palette)]
}

// decimate keeps, for each pixel column, the first, min, max and last
// points in x order (M4 decimation), so no peak is lost.
func decimate(xs, ys []float64, xmin, xmax float64, cols int) []float64 {
	n := min(len(xs), len(ys))
	if cols < 1 {
		cols = 1
	}
	out := make([]float64, 0, 8*cols)
	if n <= 4*cols {
		for i := 0; i < n; i++ {
			if !bad(xs[i]) && !bad(ys[i]) {
				out = append(out, xs[i], ys[i])
			}
		}
		return out
	}
	col := func(x float64) int { return int((x - xmin) / (xmax - xmin) * float64(cols)) }
	i := 0
	for i < n {
		if bad(xs[i]) || bad(ys[i]) {
			i++
			continue
		}
		c := col(xs[i])
		first, last, lo, hi := i, i, i, i
		j := i + 1
		for ; j < n && col(xs[j]) == c; j++ {
			if bad(xs[j]) || bad(ys[j]) {
				continue
			}
			last = j
			if ys[j] < ys[lo] {
				lo = j
			}
			if ys[j] > ys[hi] {
				hi = j
			}
		}
		idx := []int{first, lo, hi, last}
		if lo > hi {
			idx[1], idx[2] = hi, lo
		}
		prev := -1
		for _, k := range idx {
			if k != prev {
				out = append(out, xs[k], ys[k])
				prev = k
			}
		}
		i = j
	}
	return out
}

// ticks returns about n round tick values (1, 2, 5 × 10^k) covering
// [lo, hi].
func ticks(lo, hi float64, n int) []float64 {
	span := hi - lo
	if span <= 0 || n < 1 {
		return []float64{lo}
	}
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9; t += step {
		out = append(out, math.Round(t/step)*step)
		if len(out) > 100 {
			break
		}
	}
	return out
}

func bad(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func num(v float64) string {
	if v == 0 {
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 6, 64)
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder takes every write
	return b.String()
}

// drawXTicks draws the x grid and labels: p.XTicks if set, else xt.
func drawXTicks(w *bufio.Writer, p *Panel, xt []float64, sx func(float64) float64, y0, ph float64) {
	ticks := p.XTicks
	if len(ticks) == 0 {
		for _, t := range xt {
			ticks = append(ticks, Tick{V: t, Label: num(t)})
		}
	}
	for _, t := range ticks {
		fmt.Fprintf(w, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e5e5e5"/>`+"\n", f1(sx(t.V)), f1(y0), f1(sx(t.V)), f1(y0+ph))
		fmt.Fprintf(w, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", f1(sx(t.V)), f1(y0+ph+16), esc(t.Label))
	}
}

// drawLogPanel is drawPanel with a log10 y axis: the data are drawn as
// log10 values on a linear panel whose y ticks are labelled 10^k.
func drawLogPanel(w *bufio.Writer, p *Panel, ox, oy, width int) {
	q := *p
	q.YLog = false
	q.Series = nil
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		ly := make([]float64, len(s.Y))
		for i, v := range s.Y {
			ly[i] = math.NaN()
			if v > 0 && !bad(v) {
				ly[i] = math.Log10(v)
				lo, hi = math.Min(lo, ly[i]), math.Max(hi, ly[i])
			}
		}
		s.Y = ly
		q.Series = append(q.Series, s)
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0, 1
	}
	q.YFixed = true
	q.YMin, q.YMax = math.Floor(lo), math.Ceil(hi)
	if q.YMax <= q.YMin {
		q.YMax = q.YMin + 1
	}
	if p.YFixed && p.YMin > 0 && p.YMax > p.YMin {
		q.YMin, q.YMax = math.Log10(p.YMin), math.Log10(p.YMax)
	}
	// Ticks at 1, 2 and 5 times each power of ten in range.
	for e := q.YMin; e <= q.YMax; e++ {
		for _, m := range []float64{1, 2, 5} {
			if v := e + math.Log10(m); v <= q.YMax+1e-9 {
				q.yTicks = append(q.yTicks, Tick{V: v, Label: num(m * math.Pow(10, e))})
			}
		}
	}
	drawPanel(w, &q, ox, oy, width)
}
