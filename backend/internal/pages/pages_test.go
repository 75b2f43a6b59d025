package pages

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

func vmSize(t *testing.T) uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmSize:" {
			n, _ := strconv.ParseUint(f[1], 10, 64)
			return n << 10
		}
	}
	t.Fatal("no VmSize")
	return 0
}

// Mappings of any size, page multiple or not, are returned whole: mapping
// and unmapping many of them does not grow the address space.
func TestMapUnmapReturnsAddressSpace(t *testing.T) {
	for _, size := range []uint64{100, 4096, HugePage, HugePage + 4, 3*HugePage + 12345} {
		before := vmSize(t)
		const pairs = 2000
		for i := 0; i < pairs; i++ {
			b, err := Map(size)
			if err != nil {
				t.Fatal(err)
			}
			if uint64(len(b)) != size {
				t.Fatalf("len %d, want %d", len(b), size)
			}
			if size >= HugePage && uintptr(unsafe.Pointer(&b[0]))%HugePage != 0 {
				t.Fatalf("mapping of %d bytes not 2 MiB aligned", size)
			}
			b[len(b)-1] = 1
			if err := Unmap(b); err != nil {
				t.Fatal(err)
			}
		}
		// The Go runtime may map a few MiB meanwhile (heap arenas, stacks:
		// 1.7 MiB was seen under load); a leak of one page per mapping
		// would be 8 MiB here, one huge page per mapping 4 GiB.
		if after := vmSize(t); after > before+(4<<20) {
			t.Errorf("size %d: VmSize grew from %d to %d over %d map/unmap pairs", size, before, after, pairs)
		}
	}
}

func TestResident(t *testing.T) {
	b, err := Map(4 * HugePage)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(b)
	if r := Resident(b); r != 0 {
		t.Errorf("untouched: %d resident", r)
	}
	b[0] = 1
	if r := Resident(b); r == 0 || r > HugePage {
		t.Errorf("one byte touched: %d resident, want one page up to one huge page", r)
	}
}
