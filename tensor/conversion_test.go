package tensor

import (
	"strings"
	"testing"
)

func TestCheckConversion(t *testing.T) {
	old := AvailableMemory
	t.Cleanup(func() { AvailableMemory = old })
	AvailableMemory = func() uint64 { return 1200 << 20 }
	for _, c := range []struct {
		n       int
		per     uint64
		wantErr string
	}{
		{1 << 26, 40, "tensor.tolist: converting 67108864 elements needs about 2.50 GiB of memory; 1.17 GiB is available"},
		{1 << 20, 40, ""},
		{0, 40, ""},
		{1 << 62, 64, "elements needs about 8192.00 PiB of memory"},
	} {
		err := CheckConversion("tensor.tolist", c.n, c.per)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%d×%d: %v", c.n, c.per, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%d×%d: err = %v, want %q", c.n, c.per, err, c.wantErr)
		}
	}
}
