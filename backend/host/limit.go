package host

import (
	"fmt"
	"runtime/debug"
	"syscall"

	"github.com/memsh/memsh/backend"
)

// The host memory limits memsh honours. A process can be stopped short of
// the RAM the machine has by its address-space limit (RLIMIT_AS: `ulimit
// -v`, `prlimit --as`, common on clusters), its data-segment limit
// (RLIMIT_DATA) or its memory cgroup (cgroup v2 memory.max, v1
// memory.limit_in_bytes). Go's runtime does not survive an allocation
// that crosses one of them (a fatal "out of memory", not an error), so
// memsh asks before the large allocations a script can cause (CheckAlloc)
// and runs its collector harder as it nears them (SetGoMemoryLimit).

// Room returns the bytes this process may still take and the name of the
// limit that leaves the least: MemAvailable, the memory cgroup's room,
// RLIMIT_AS less the address space in use (VmSize), RLIMIT_DATA less the
// data segment (VmData). It returns 0 and "" when nothing can be read.
func Room() (uint64, string) {
	room, name := Available(), "the RAM available (MemAvailable)"
	if room == 0 {
		name = ""
	}
	consider := func(r uint64, n string) {
		if name == "" || r < room {
			room, name = r, n
		}
	}
	if r, ok := cgroupRoom(); ok {
		consider(r, "the memory cgroup's limit")
	}
	for _, l := range rlimits() {
		if l.used >= l.limit {
			consider(0, l.name)
		} else {
			consider(l.limit-l.used, l.name)
		}
	}
	return room, name
}

// rlimit is a resource limit in force and what the process uses of it.
type rlimit struct {
	name        string
	limit, used uint64
}

// rlimits returns RLIMIT_AS against VmSize and RLIMIT_DATA against
// VmData, those that are set and readable.
func rlimits() []rlimit {
	var out []rlimit
	for _, l := range []struct {
		res   int
		field string
		name  string
	}{
		{syscall.RLIMIT_AS, "VmSize", "the address-space limit (RLIMIT_AS, ulimit -v)"},
		{syscall.RLIMIT_DATA, "VmData", "the data-segment limit (RLIMIT_DATA, ulimit -d)"},
	} {
		var rl syscall.Rlimit
		if syscall.Getrlimit(l.res, &rl) != nil || rl.Cur >= 1<<62 {
			continue
		}
		used, err := statusField(l.field)
		if err != nil {
			continue
		}
		out = append(out, rlimit{name: l.name, limit: rl.Cur, used: used})
	}
	return out
}

// AllocCheckMin is the smallest allocation CheckAlloc checks: below it an
// allocation passes unread (reading the limits costs a few microseconds).
const AllocCheckMin = 16 << 20

// allocMargin is what CheckAlloc keeps free beside an allocation: the
// collector's and the runtime's own needs while the allocation is made.
func allocMargin(n uint64) uint64 { return 64<<20 + n/8 }

// CheckAlloc returns an error naming what (a built-in, an operator) and
// the size when an allocation of n bytes of Go heap would cross a host
// memory limit (Room); nil otherwise, and for n below AllocCheckMin.
func CheckAlloc(what string, n uint64) error {
	if n < AllocCheckMin {
		return nil
	}
	room, name := Room()
	if name == "" {
		return nil
	}
	if n < 1<<62 && n+allocMargin(n) <= room {
		return nil
	}
	return fmt.Errorf("%s: needs about %s of host memory; %s is left under %s", what, backend.FormatBytes(int64(min(n, 1<<62))), backend.FormatBytes(int64(room)), name)
}

// SetGoMemoryLimit sets Go's soft memory limit (debug.SetMemoryLimit) to
// 90% of the tightest hard limit on the process — RLIMIT_AS and
// RLIMIT_DATA less what the process maps that is not Go's, the memory
// cgroup's limit — so that the collector works harder, not the kernel's
// OOM killer or the runtime's fatal error, as memsh nears it. It returns
// the limit set, or 0 (nothing changed) when there is no such limit.
func SetGoMemoryLimit() uint64 {
	var limit uint64
	take := func(v uint64) {
		if v > 0 && (limit == 0 || v < limit) {
			limit = v
		}
	}
	for _, l := range rlimits() {
		// what is mapped now but is not Go's heap stays mapped
		goNow := goMapped()
		other := uint64(0)
		if l.used > goNow {
			other = l.used - goNow
		}
		if l.limit > other {
			take(l.limit - other)
		} else {
			take(1)
		}
	}
	if max, ok := cgroupLimit(); ok {
		take(max)
	}
	if limit == 0 {
		return 0
	}
	limit = limit / 10 * 9
	debug.SetMemoryLimit(int64(min(limit, 1<<62)))
	return limit
}
