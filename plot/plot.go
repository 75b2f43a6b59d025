// Package plot draws memsh's outputs as SVG or PNG charts with
// gonum.org/v1/plot (memsh plot): a sweep's peak memory per device against
// its swept parameter, from --out records, with each device's capacity
// and the points that ran out of memory marked; and memory over time, from
// a --trace file.
package plot

import (
	"bytes"
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"strings"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/fsafe"
)

// DefaultWidth and DefaultHeight are the size of a chart.
const (
	DefaultWidth  = 8 * vg.Inch
	DefaultHeight = 5 * vg.Inch
)

var oomColor = color.RGBA{R: 214, G: 39, B: 40, A: 255}

// Save writes p to path as SVG or PNG, by the file's extension (".svg",
// ".png"); width and height of 0 mean DefaultWidth and DefaultHeight.
func Save(p *gplot.Plot, path string, width, height vg.Length) error {
	return SaveAll([]*gplot.Plot{p}, path, width, height, false)
}

// SaveAll writes plots to path as SVG or PNG (by its extension), one panel
// under another, each width by height (0: DefaultWidth, DefaultHeight).
// The file is written whole or not at all (a temporary file renamed into
// place) and replaces an existing file only if memsh drew it in the same
// format (its mark) or overwrite is true (memsh plot --force).
func SaveAll(plots []*gplot.Plot, path string, width, height vg.Length, overwrite bool) error {
	kind, err := imageKind(path)
	if err != nil {
		return err
	}
	return fsafe.WriteFile(path, kind, overwrite, func(w io.Writer) error {
		return WriteImage(w, plots, kind == fsafe.PNG, width, height)
	})
}

func imageKind(path string) (fsafe.Kind, error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".svg":
		return fsafe.SVG, nil
	case ".png":
		return fsafe.PNG, nil
	default:
		return "", fmt.Errorf("%s: unsupported format %q (want .svg or .png)", path, ext)
	}
}

// WriteImage draws plots one under another and writes them to w as PNG
// (png true) or SVG.
func WriteImage(w io.Writer, plots []*gplot.Plot, png bool, width, height vg.Length) error {
	if len(plots) == 0 {
		return fmt.Errorf("nothing to plot")
	}
	if width <= 0 {
		width = DefaultWidth
	}
	if height <= 0 {
		height = DefaultHeight
	}
	total := height * vg.Length(len(plots))
	var c interface {
		vg.CanvasSizer
		io.WriterTo
	}
	if png {
		c = vgimg.PngCanvas{Canvas: vgimg.New(width, total)}
	} else {
		c = vgsvg.New(width, total)
	}
	dc := draw.New(c)
	if len(plots) == 1 {
		plots[0].Draw(dc)
	} else {
		grid := make([][]*gplot.Plot, len(plots))
		for i, p := range plots {
			grid[i] = []*gplot.Plot{p}
		}
		tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadY: vg.Points(12)}
		for i, row := range gplot.Align(grid, tiles, dc) {
			plots[i].Draw(row[0])
		}
	}
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return err
	}
	_, err := w.Write(markImage(buf.Bytes(), png))
	return err
}

// byteUnit picks MiB or GiB (or KiB) for values up to maxBytes.
func byteUnit(maxBytes float64) (float64, string) {
	switch {
	case maxBytes >= 1<<30:
		return 1 << 30, "GiB"
	case maxBytes >= 1<<20:
		return 1 << 20, "MiB"
	}
	return 1 << 10, "KiB"
}

// log2Ticks labels powers of two.
type log2Ticks struct{}

func (log2Ticks) Ticks(lo, hi float64) []gplot.Tick {
	var ticks []gplot.Tick
	for e := math.Floor(math.Log2(lo)); math.Pow(2, e) <= hi*1.0001; e++ {
		v := math.Pow(2, e)
		if v >= lo*0.9999 {
			ticks = append(ticks, gplot.Tick{Value: v, Label: trimFloat(v)})
		}
	}
	return ticks
}

func trimFloat(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%g", v)
}

// capacityLine is a horizontal dashed line at y from x0 to x1.
func capacityLine(x0, x1, y float64, c color.Color) (*plotter.Line, error) {
	l, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
	if err != nil {
		return nil, err
	}
	l.Color = c
	l.Width = vg.Points(1.2)
	l.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
	return l, nil
}

func oomScatter(pts plotter.XYs) (*plotter.Scatter, error) {
	s, err := plotter.NewScatter(pts)
	if err != nil {
		return nil, err
	}
	s.GlyphStyle = draw.GlyphStyle{Color: oomColor, Radius: vg.Points(4), Shape: draw.CrossGlyph{}}
	return s, nil
}

// palette colors series and capacity lines: no red, which marks the
// points that ran out of memory and nothing else.
var palette = []color.Color{
	color.RGBA{R: 31, G: 119, B: 180, A: 255},  // blue
	color.RGBA{R: 44, G: 160, B: 44, A: 255},   // green
	color.RGBA{R: 255, G: 127, B: 14, A: 255},  // orange
	color.RGBA{R: 148, G: 103, B: 189, A: 255}, // purple
	color.RGBA{R: 23, G: 190, B: 207, A: 255},  // cyan
	color.RGBA{R: 140, G: 86, B: 75, A: 255},   // brown
	color.RGBA{R: 127, G: 127, B: 127, A: 255}, // gray
	color.RGBA{R: 188, G: 189, B: 34, A: 255},  // olive
}

func seriesColor(i int) color.Color { return palette[i%len(palette)] }

func capacityLabel(device string, total int64) string {
	return fmt.Sprintf("%s capacity (%s)", device, backend.FormatBytes(total))
}
