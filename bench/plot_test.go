package main

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// The plot is well-formed SVG with a bar and a latency box per target.
func TestPlotIsSVG(t *testing.T) {
	qs := []time.Duration{100 * time.Microsecond, 200 * time.Microsecond, 300 * time.Microsecond, 400 * time.Microsecond, 500 * time.Microsecond, 2 * time.Millisecond, 9 * time.Millisecond}
	results := []result{
		{name: "ReverseProxy", rps: 10000, quantiles: qs},
		{name: "idemproxy first attempts <&>", rps: 5000, quantiles: qs},
		{name: "no quantiles", rps: 7000},
	}
	svg := plot(options{concurrency: 32, delays: []time.Duration{0}}, results)
	d := xml.NewDecoder(strings.NewReader(string(svg)))
	rects := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			rects++
		}
	}
	// The background, three bars, two boxes.
	if rects != 6 {
		t.Errorf("%d rects, want 6:\n%s", rects, svg)
	}
	if !strings.Contains(string(svg), "0.50×") {
		t.Errorf("no ratio against ReverseProxy:\n%s", svg)
	}
}
