// Package numarg converts the numeric arguments of memsh's builtins (sizes,
// counts, byte figures, durations) with errors that name the builtin and
// the parameter and say what is wrong with the number: NaN or an infinity
// where a finite number is expected, a negative size, an integer too large
// for the parameter ("gpu.leave_free: for parameter nbytes: 2^70 is too
// large (max 2^63-1)") rather than Starlark's generic "got int, want
// number".
package numarg

import (
	"fmt"
	"math"
	"math/big"

	"go.starlark.net/starlark"
)

// MaxInt64 is the largest size a parameter takes unless it says otherwise.
const MaxInt64 = math.MaxInt64

// Show formats a Starlark integer for an error: exact powers of two as
// "2^k", others in decimal.
func Show(i starlark.Int) string {
	b := i.BigInt()
	if b.Sign() > 0 {
		n := b.BitLen() - 1
		if n >= 10 && new(big.Int).Lsh(big.NewInt(1), uint(n)).Cmp(b) == 0 {
			return fmt.Sprintf("2^%d", n)
		}
	}
	if b.Sign() < 0 {
		nb := new(big.Int).Neg(b)
		n := nb.BitLen() - 1
		if n >= 10 && new(big.Int).Lsh(big.NewInt(1), uint(n)).Cmp(nb) == 0 {
			return fmt.Sprintf("-2^%d", n)
		}
	}
	return i.String()
}

// showMax formats a limit: 2^k-1 for those, else decimal.
func showMax(max uint64) string {
	if max >= 1<<10 && max&(max+1) == 0 {
		n := 0
		for m := max; m != 0; m >>= 1 {
			n++
		}
		return fmt.Sprintf("2^%d-1", n)
	}
	if max >= 1<<10 && max&(max-1) == 0 {
		n := -1
		for m := max; m != 0; m >>= 1 {
			n++
		}
		return fmt.Sprintf("2^%d", n)
	}
	return fmt.Sprint(max)
}

func floatName(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "+inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	return starlark.Float(f).String()
}

func errorf(fn, param, format string, args ...any) error {
	return fmt.Errorf("%s: for parameter %s: %s", fn, param, fmt.Sprintf(format, args...))
}

// Finite converts an int or float argument to a finite float64.
func Finite(fn, param string, v starlark.Value) (float64, error) {
	switch v := v.(type) {
	case starlark.Int:
		f := v.Float()
		if math.IsInf(float64(f), 0) {
			return 0, errorf(fn, param, "%s is too large (max %g)", Show(v), math.MaxFloat64)
		}
		return float64(f), nil
	case starlark.Float:
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return 0, errorf(fn, param, "got %s, want a finite number", floatName(float64(v)))
		}
		return float64(v), nil
	}
	return 0, errorf(fn, param, "got %s, want int or float", v.Type())
}

// Int64 converts an int or float argument (a float is truncated toward
// zero) to an int64: a byte figure that may be negative (a delta).
func Int64(fn, param string, v starlark.Value) (int64, error) {
	switch v := v.(type) {
	case starlark.Int:
		if i, ok := v.Int64(); ok {
			return i, nil
		}
		if v.Sign() > 0 {
			return 0, errorf(fn, param, "%s is too large (max 2^63-1)", Show(v))
		}
		return 0, errorf(fn, param, "%s is too small (min -2^63)", Show(v))
	case starlark.Float:
		f, err := Finite(fn, param, v)
		if err != nil {
			return 0, err
		}
		if f >= math.MaxInt64 {
			return 0, errorf(fn, param, "%s is too large (max 2^63-1)", floatName(f))
		}
		if f < math.MinInt64 {
			return 0, errorf(fn, param, "%s is too small (min -2^63)", floatName(f))
		}
		return int64(f), nil
	}
	return 0, errorf(fn, param, "got %s, want int or float", v.Type())
}

// Size converts an int or float argument (a float is truncated toward
// zero) to a size or count in [0, max].
func Size(fn, param string, v starlark.Value, max uint64) (uint64, error) {
	switch v := v.(type) {
	case starlark.Int:
		if v.Sign() < 0 {
			return 0, errorf(fn, param, "%s is negative (want 0 to %s)", Show(v), showMax(max))
		}
		if u, ok := v.Uint64(); ok && u <= max {
			return u, nil
		}
		return 0, errorf(fn, param, "%s is too large (max %s)", Show(v), showMax(max))
	case starlark.Float:
		f, err := Finite(fn, param, v)
		if err != nil {
			return 0, err
		}
		if f < 0 {
			return 0, errorf(fn, param, "%s is negative (want 0 to %s)", floatName(f), showMax(max))
		}
		if f >= float64(max) && (f >= 1<<64 || uint64(f) > max) {
			return 0, errorf(fn, param, "%s is too large (max %s)", floatName(f), showMax(max))
		}
		return uint64(f), nil
	}
	return 0, errorf(fn, param, "got %s, want int or float", v.Type())
}

// Count converts an integer argument to a count in [min, max]; floats are
// refused (a count is whole).
func Count(fn, param string, v starlark.Value, min, max int64) (int64, error) {
	switch v := v.(type) {
	case starlark.Int:
		i, ok := v.Int64()
		if ok && i >= min && i <= max {
			return i, nil
		}
		if v.Sign() < 0 || (ok && i < min) {
			return 0, errorf(fn, param, "%s is too small (min %d)", Show(v), min)
		}
		return 0, errorf(fn, param, "%s is too large (max %s)", Show(v), showMax(uint64(max)))
	case starlark.Float:
		if _, err := Finite(fn, param, v); err != nil {
			return 0, err
		}
		return 0, errorf(fn, param, "got float %s, want int", floatName(float64(v)))
	}
	return 0, errorf(fn, param, "got %s, want int", v.Type())
}
