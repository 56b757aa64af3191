package main

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"
)

// plotQuantiles are the latencies a result keeps for the plot: a box from
// p25 to p75 with p50 marked, whiskers to p10 and p99, and p99.9 a dot.
var plotQuantiles = []float64{.10, .25, .50, .75, .90, .99, .999}

// plot draws results as an SVG, one block per upstream delay: each
// target's throughput as a bar against ReverseProxy's (the dashed line),
// and its latency distribution on a logarithmic axis.
func plot(o options, results []result) []byte {
	var blocks []string
	y := 30
	title := fmt.Sprintf("idemproxy against a plain reverse proxy: closed loop, concurrency %d", o.concurrency)
	if o.rate > 0 {
		title = fmt.Sprintf("idemproxy against a plain reverse proxy: %.0f requests/s", o.rate)
	}
	for _, delay := range o.delays {
		var rows []result
		var base float64
		for _, r := range results {
			if r.delay == delay {
				rows = append(rows, r)
				if r.name == "ReverseProxy" {
					base = r.rps
				}
			}
		}
		if len(rows) == 0 {
			continue
		}
		block, bottom := plotBlock(rows, base, delay, y)
		blocks = append(blocks, block)
		y = bottom + 40
	}
	var out strings.Builder
	fmt.Fprintf(&out, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="13">`+"\n", plotWidth, y)
	fmt.Fprintf(&out, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&out, `<text x="10" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	for _, b := range blocks {
		out.WriteString(b)
	}
	out.WriteString("</svg>\n")
	return []byte(out.String())
}

// The plot's geometry, in pixels.
const (
	labelW    = 330
	barW      = 300
	gap       = 40
	latW      = 420
	rowH      = 22
	headH     = 58
	plotWidth = labelW + barW + gap + latW + 30
)

// plotScale places rows' throughput (relative to ReverseProxy's base) and
// latencies (on a log scale) on the plot.
type plotScale struct {
	base, maxRatio float64
	logLo, logHi   float64
}

// newPlotScale is the scale that fits rows.
func newPlotScale(rows []result, base float64) plotScale {
	maxRatio, lo, hi := 1.0, time.Duration(math.MaxInt64), time.Duration(0)
	for _, r := range rows {
		if base > 0 {
			maxRatio = max(maxRatio, r.rps/base)
		}
		if len(r.quantiles) == len(plotQuantiles) {
			lo, hi = min(lo, r.quantiles[0]), max(hi, r.quantiles[len(r.quantiles)-1])
		}
	}
	if hi == 0 {
		lo, hi = time.Microsecond, time.Millisecond
	}
	sc := plotScale{base: base, maxRatio: maxRatio, logLo: math.Floor(math.Log10(float64(lo))), logHi: math.Ceil(math.Log10(float64(hi)))}
	if sc.logHi <= sc.logLo {
		sc.logHi = sc.logLo + 1
	}
	return sc
}

// lx is where latency d falls.
func (sc plotScale) lx(d time.Duration) float64 {
	v := (math.Log10(float64(max(d, 1))) - sc.logLo) / (sc.logHi - sc.logLo)
	return float64(labelW+barW+gap) + v*latW
}

// plotBlock draws rows, measured at delay, from y down; it returns the
// drawing and where it ends.
func plotBlock(rows []result, base float64, delay time.Duration, y int) (string, int) {
	sc := newPlotScale(rows, base)
	var b strings.Builder
	fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">upstream service time %s</text>`+"\n", y+16, delay)
	fmt.Fprintf(&b, `<text x="%d" y="%d">requests/s, relative to ReverseProxy (dashed)</text>`+"\n", labelW, y+40)
	fmt.Fprintf(&b, `<text x="%d" y="%d">latency, log scale: p10–p99 line, p25–p75 box, p50 bar, p99.9 dot</text>`+"\n", labelW+barW+gap, y+40)
	top := y + headH
	for i, r := range rows {
		plotRow(&b, sc, r, top+i*rowH)
	}
	bottom := top + len(rows)*rowH
	fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#333" stroke-dasharray="4 3"/>`+"\n",
		float64(labelW)+barW/sc.maxRatio, float64(labelW)+barW/sc.maxRatio, top, bottom)
	for e := sc.logLo; e <= sc.logHi; e++ {
		x := sc.lx(time.Duration(math.Pow(10, e)))
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#ccc"/>`+"\n", x, x, top, bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="11" text-anchor="middle">%s</text>`+"\n", x, bottom+14, time.Duration(math.Pow(10, e)))
	}
	return b.String(), bottom
}

// plotRow draws r's row at ry: its bar and its latency distribution.
func plotRow(b *strings.Builder, sc plotScale, r result, ry int) {
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-8, ry+15, html.EscapeString(r.name))
	ratio := 0.0
	if sc.base > 0 {
		ratio = r.rps / sc.base
	}
	w := ratio / sc.maxRatio * barW
	fill := "#9aa5b1"
	if strings.HasPrefix(r.name, "idemproxy") {
		fill = "#2f6fdf"
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelW, ry+3, w, rowH-6, fill)
	fmt.Fprintf(b, `<text x="%.1f" y="%d" font-size="11">%.2f× (%.0f/s)</text>`+"\n", float64(labelW)+w+4, ry+15, ratio, r.rps)
	if len(r.quantiles) != len(plotQuantiles) {
		return
	}
	q := r.quantiles
	mid := float64(ry + rowH/2)
	fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#333"/>`+"\n", sc.lx(q[0]), sc.lx(q[5]), mid, mid)
	fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" stroke="#333"/>`+"\n", sc.lx(q[1]), ry+4, max(sc.lx(q[3])-sc.lx(q[1]), 1), rowH-8, fill)
	fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#000" stroke-width="2"/>`+"\n", sc.lx(q[2]), sc.lx(q[2]), ry+3, ry+rowH-3)
	fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="#c0392b"/>`+"\n", sc.lx(q[6]), mid)
}
