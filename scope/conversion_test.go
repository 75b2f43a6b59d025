package scope_test

import (
	"strings"
	"testing"

	"github.com/memsh/memsh/tensor"
)

// A conversion that needs more Go heap than the process may still take is
// an error before it starts (issue 13 item 4), with the figures; the
// Session goes on, and conversions that fit still work.
func TestConversionNeedsMemory(t *testing.T) {
	old := tensor.AvailableMemory
	t.Cleanup(func() { tensor.AvailableMemory = old })
	tensor.AvailableMemory = func() uint64 { return 1200 << 20 }

	s, out := newSession(t, "sim:1GiB")
	if err := s.Exec("big.star", `big = tensor.zeros([1 << 26], dtype="uint8")`); err != nil {
		t.Fatal(err)
	}
	err := s.Exec("tolist.star", "l = big.tolist()")
	want := "tensor.tolist: converting 67108864 elements needs about 4.00 GiB of memory; 1.17 GiB is available"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want %q", err, want)
	}
	// A view of the same storage that fits converts; item() and printing
	// (summarised, as PyTorch) need nothing in proportion.
	if err := s.Exec("ok.star", "print(len(big[:1000].tolist()), big[5].item())\nprint(big)"); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.HasPrefix(got, "1000 0\ntensor([0, 0, 0,  ..., 0, 0, 0], dtype=tensor.uint8)") {
		t.Errorf("output %q", got)
	}
	tensor.AvailableMemory = func() uint64 { return 100 << 20 }
	if err := s.Exec("tolist.star", "l = big[:1 << 21].tolist()"); err == nil || !strings.Contains(err.Error(), "needs about 128.00 MiB of memory; 100.00 MiB is available") {
		t.Fatalf("err = %v", err)
	}
	// Unknown available memory (0) is not checked.
	tensor.AvailableMemory = func() uint64 { return 0 }
	if err := s.Exec("tolist.star", "l = len(big[:1 << 21].tolist())"); err != nil {
		t.Fatal(err)
	}
}
