package tensor

import (
	"math"
	"runtime"
	"strconv"
	"strings"
)

// Printing, after PyTorch's torch/_tensor_str.py with its default print
// options: precision 4, line width 80, tensors of more than 1000 elements
// summarised to their first and last 3 entries per dimension with "...".
// Suffixes: device='cuda:0' when not on the CPU, size=(...) for empty
// tensors that are not 1-D and for tensors whose values are not available,
// meta=True on a meta device (whose tensors print "..." for their values,
// as PyTorch's meta tensors do: str() cannot fail), and
// dtype=tensor.float16 when the dtype is not float32, int64 or bool.

const (
	printPrecision = 4
	printLineWidth = 80
	printThreshold = 1000
	printEdgeItems = 3
)

// SizeString formats a shape as a Python tuple: "()", "(3,)", "(2, 3)".
func SizeString(shape []int) string {
	b := []byte{'('}
	for i, s := range shape {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, int64(s), 10)
	}
	if len(shape) == 1 {
		b = append(b, ',')
	}
	return string(append(b, ')'))
}

// Format is the PyTorch-style representation of t from its values (no
// GPU dispatch: a real GPU's tensor prints "..."); Tensor.String copies a
// real GPU's values to the host first.
func Format(t *Tensor) string { return formatTensor(t) }

func formatTensor(t *Tensor) string {
	const prefix = "tensor("
	var suffixes []string
	dev := t.mem.Device()
	if dev != "cpu" {
		suffixes = append(suffixes, "device='"+dev+"'")
	}
	var body string
	sizeSuffix := "size=" + SizeString(t.shape)
	switch {
	case t.mem.Err() != nil:
		body = "<" + t.mem.Err().Error() + ">"
		suffixes = append(suffixes, sizeSuffix)
	case !t.hasData():
		body = "..."
		suffixes = append(suffixes, sizeSuffix)
		if t.isMeta() {
			suffixes = append(suffixes, "meta=True")
		}
	case t.Numel() == 0:
		body = "[]"
		if len(t.shape) != 1 {
			suffixes = append(suffixes, sizeSuffix)
		}
	default:
		body = formatValues(t, len(prefix))
	}
	if t.dtype != DefaultFloat && t.dtype != Int64 && t.dtype != Bool {
		suffixes = append(suffixes, "dtype=tensor."+t.dtype.String())
	}
	runtime.KeepAlive(t)
	if len(suffixes) == 0 {
		return prefix + body + ")"
	}
	return prefix + body + ", " + strings.Join(suffixes, ", ") + ")"
}

// formatter is PyTorch's _Formatter: one width and style for all values.
type formatter struct {
	dt       DType
	intMode  bool
	sciMode  bool
	maxWidth int
}

// value is one element: f for floating dtypes, i for the others.
type value struct {
	f float64
	i int64
}

func newFormatter(dt DType, vals []value) *formatter {
	f := &formatter{dt: dt, intMode: true, maxWidth: 1}
	if !dt.IsFloat() {
		for _, v := range vals {
			f.maxWidth = max(f.maxWidth, len(f.raw(v)))
		}
		return f
	}
	// Floats: the style and width come from the nonzero finite values.
	var nz []value
	var nzMin, nzMax float64
	for _, x := range vals {
		v := x.f
		if math.IsInf(v, 0) || math.IsNaN(v) || v == 0 {
			continue
		}
		if v != math.Ceil(v) {
			f.intMode = false
		}
		a := math.Abs(v)
		if len(nz) == 0 {
			nzMin, nzMax = a, a
		}
		nzMin, nzMax = min(nzMin, a), max(nzMax, a)
		nz = append(nz, x)
	}
	if len(nz) == 0 {
		return f
	}
	if f.intMode {
		f.sciMode = nzMax/nzMin > 1000 || nzMax > 1e8
	} else {
		f.sciMode = nzMax/nzMin > 1000 || nzMax > 1e8 || nzMin < 1e-4
	}
	for _, v := range nz {
		f.maxWidth = max(f.maxWidth, len(f.raw(v)))
	}
	return f
}

// raw formats x without padding.
func (f *formatter) raw(x value) string {
	v := x.f
	switch {
	case f.dt == Bool:
		if x.i != 0 {
			return "True"
		}
		return "False"
	case !f.dt.IsFloat():
		return strconv.FormatInt(x.i, 10)
	case math.IsNaN(v):
		return "nan"
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	case f.sciMode:
		return strconv.FormatFloat(v, 'e', printPrecision, 64)
	case f.intMode:
		return strconv.FormatFloat(v, 'f', 0, 64) + "."
	}
	return strconv.FormatFloat(v, 'f', printPrecision, 64)
}

func (f *formatter) format(v value) string {
	s := f.raw(v)
	return strings.Repeat(" ", max(0, f.maxWidth-len(s))) + s
}

// formatValues formats a tensor that has data and elements.
func formatValues(t *Tensor, indent int) string {
	summarize := t.Numel() > printThreshold
	idx := make([]int, len(t.shape))
	// First pass: the values shown, for the formatter.
	var vals []value
	var collect func(d int)
	collect = func(d int) {
		if d == len(t.shape) {
			vals = append(vals, elemValue(t, idx))
			return
		}
		for _, i := range shownIndices(t.shape[d], summarize) {
			if i < 0 {
				continue
			}
			idx[d] = i
			collect(d + 1)
		}
	}
	collect(0)
	f := newFormatter(t.dtype, vals)
	if len(t.shape) == 0 {
		return f.raw(vals[0])
	}
	k := 0
	var str func(d, indent int) string
	str = func(d, indent int) string {
		if d == len(t.shape)-1 {
			elemLen := f.maxWidth + 2
			perLine := max(1, (printLineWidth-indent)/elemLen)
			var data []string
			for _, i := range shownIndices(t.shape[d], summarize) {
				if i < 0 {
					data = append(data, " ...")
					continue
				}
				data = append(data, f.format(vals[k]))
				k++
			}
			var lines []string
			for i := 0; i < len(data); i += perLine {
				lines = append(lines, strings.Join(data[i:min(i+perLine, len(data))], ", "))
			}
			return "[" + strings.Join(lines, ",\n"+strings.Repeat(" ", indent+1)) + "]"
		}
		var slices []string
		for _, i := range shownIndices(t.shape[d], summarize) {
			if i < 0 {
				slices = append(slices, "...")
				continue
			}
			slices = append(slices, str(d+1, indent+1))
		}
		sep := "," + strings.Repeat("\n", len(t.shape)-d-1) + strings.Repeat(" ", indent+1)
		return "[" + strings.Join(slices, sep) + "]"
	}
	return str(0, indent)
}

// shownIndices lists the indices printed along a dimension of size n; -1
// stands for the "..." of a summary.
func shownIndices(n int, summarize bool) []int {
	if summarize && n > 2*printEdgeItems {
		out := make([]int, 0, 2*printEdgeItems+1)
		for i := range printEdgeItems {
			out = append(out, i)
		}
		out = append(out, -1)
		for i := n - printEdgeItems; i < n; i++ {
			out = append(out, i)
		}
		return out
	}
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// elemValue reads the element at idx.
func elemValue(t *Tensor, idx []int) value {
	off := t.offset
	for d, i := range idx {
		off += i * t.strides[d]
	}
	p := elemAddr(t.mem.Pointer(), off, t.dtype.Size())
	if t.dtype.IsFloat() {
		return value{f: loadF64[t.dtype](p)}
	}
	return value{i: loadI64[t.dtype](p)}
}
