package numarg_test

import (
	"math"
	"math/big"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/starlib/numarg"
)

func bigInt(shift uint) starlark.Int {
	return starlark.MakeBigInt(new(big.Int).Lsh(big.NewInt(1), shift))
}

func TestErrors(t *testing.T) {
	nan, inf := starlark.Float(math.NaN()), starlark.Float(math.Inf(1))
	for _, tc := range []struct {
		name string
		f    func() error
		want string
	}{
		{"size nan", func() error { _, err := numarg.Size("gpu.leave_free", "nbytes", nan, numarg.MaxInt64); return err },
			"gpu.leave_free: for parameter nbytes: got nan, want a finite number"},
		{"size -inf", func() error {
			_, err := numarg.Size("f", "n", starlark.Float(math.Inf(-1)), numarg.MaxInt64)
			return err
		}, "f: for parameter n: got -inf, want a finite number"},
		{"size 2^70", func() error {
			_, err := numarg.Size("gpu.leave_free", "nbytes", bigInt(70), numarg.MaxInt64)
			return err
		},
			"gpu.leave_free: for parameter nbytes: 2^70 is too large (max 2^63-1)"},
		{"size 2^63", func() error { _, err := numarg.Size("f", "n", bigInt(63), numarg.MaxInt64); return err },
			"f: for parameter n: 2^63 is too large (max 2^63-1)"},
		{"size float too large", func() error { _, err := numarg.Size("f", "n", starlark.Float(1e30), numarg.MaxInt64); return err },
			"f: for parameter n: 1e+30 is too large (max 2^63-1)"},
		{"size negative", func() error { _, err := numarg.Size("f", "n", starlark.MakeInt(-1), numarg.MaxInt64); return err },
			"f: for parameter n: -1 is negative (want 0 to 2^63-1)"},
		{"size string", func() error { _, err := numarg.Size("f", "n", starlark.String("1"), numarg.MaxInt64); return err },
			"f: for parameter n: got string, want int or float"},
		{"int64 inf", func() error { _, err := numarg.Int64("fmt_bytes", "n", inf); return err },
			"fmt_bytes: for parameter n: got +inf, want a finite number"},
		{"int64 2^70", func() error { _, err := numarg.Int64("fmt_bytes", "n", bigInt(70)); return err },
			"fmt_bytes: for parameter n: 2^70 is too large (max 2^63-1)"},
		{"int64 -2^64", func() error {
			_, err := numarg.Int64("fmt_bytes", "n", starlark.MakeInt(0).Sub(bigInt(64)))
			return err
		}, "fmt_bytes: for parameter n: -2^64 is too small (min -2^63)"},
		{"count float", func() error {
			_, err := numarg.Count("profile_every", "n", starlark.Float(2), 1, numarg.MaxInt64)
			return err
		},
			"profile_every: for parameter n: got float 2.0, want int"},
		{"count nan", func() error { _, err := numarg.Count("profile_every", "n", nan, 1, numarg.MaxInt64); return err },
			"profile_every: for parameter n: got nan, want a finite number"},
		{"count zero", func() error {
			_, err := numarg.Count("profile_every", "n", starlark.MakeInt(0), 1, numarg.MaxInt64)
			return err
		},
			"profile_every: for parameter n: 0 is too small (min 1)"},
		{"finite nan", func() error { _, err := numarg.Finite("host.cpu_percent", "interval", nan); return err },
			"host.cpu_percent: for parameter interval: got nan, want a finite number"},
	} {
		err := tc.f()
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestValues(t *testing.T) {
	if n, err := numarg.Size("f", "n", starlark.Float(1.9), numarg.MaxInt64); err != nil || n != 1 {
		t.Errorf("Size(1.9) = %d, %v", n, err)
	}
	if n, err := numarg.Size("f", "n", starlark.MakeInt64(math.MaxInt64), numarg.MaxInt64); err != nil || n != math.MaxInt64 {
		t.Errorf("Size(2^63-1) = %d, %v", n, err)
	}
	if n, err := numarg.Int64("f", "n", starlark.MakeInt(-5)); err != nil || n != -5 {
		t.Errorf("Int64(-5) = %d, %v", n, err)
	}
	if n, err := numarg.Count("f", "n", starlark.MakeInt(3), 1, 10); err != nil || n != 3 {
		t.Errorf("Count(3) = %d, %v", n, err)
	}
}
