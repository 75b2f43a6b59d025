package host

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime/metrics"
	"strconv"
	"sync"
	"syscall"

	"github.com/shirou/gopsutil/v3/mem"
)

// procFile is a /proc file of this process kept open and read with pread at
// offset 0, which makes the kernel regenerate its contents: one system call
// per reading, no open/close, no allocation.
type procFile struct {
	path string
	once sync.Once
	fd   int
	err  error

	mu  sync.Mutex
	buf []byte
}

// parse reads the file and calls f with its contents, which are valid only
// during the call.
func (p *procFile) parse(f func([]byte) (uint64, error)) (uint64, error) {
	p.once.Do(func() {
		p.fd, p.err = syscall.Open(p.path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if p.err != nil {
			p.err = &os.PathError{Op: "open", Path: p.path, Err: p.err}
		}
		p.buf = make([]byte, 4096)
	})
	if p.err != nil {
		return 0, p.err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		n, err := syscall.Pread(p.fd, p.buf, 0)
		if err != nil {
			return 0, &os.PathError{Op: "read", Path: p.path, Err: err}
		}
		if n < len(p.buf) {
			return f(p.buf[:n])
		}
		p.buf = make([]byte, 2*len(p.buf)) // the file did not fit
	}
}

var (
	statm   = procFile{path: "/proc/self/statm"}
	status  = procFile{path: "/proc/self/status"}
	meminfo = procFile{path: "/proc/meminfo"}

	pageSize = uint64(os.Getpagesize())
)

// RSS returns this process's resident set size in bytes: the second field of
// /proc/self/statm times the page size. It costs one pread system call.
func RSS() (uint64, error) {
	return statm.parse(parseStatm)
}

func parseStatm(b []byte) (uint64, error) {
	// "size resident shared text lib data dt"
	_, rest, ok := bytes.Cut(b, []byte{' '})
	if ok {
		field, _, _ := bytes.Cut(rest, []byte{' '})
		if pages, err := strconv.ParseUint(string(field), 10, 64); err == nil {
			return pages * pageSize, nil
		}
	}
	return 0, fmt.Errorf("host: cannot parse /proc/self/statm: %q", b)
}

// statusField returns a "kB" field of /proc/self/status (VmHWM, VmRSS, ...)
// in bytes.
func statusField(name string) (uint64, error) { return kBField(&status, name) }

// kBField returns the "NAME:   N kB" line of a /proc file in bytes.
func kBField(p *procFile, name string) (uint64, error) {
	return p.parse(func(b []byte) (uint64, error) { return kBValue(b, name, p.path) })
}

// kBValue parses the "NAME:   N kB" line of the contents b of the /proc
// file path, in bytes.
func kBValue(b []byte, name, path string) (uint64, error) {
	key := name + ":"
	i := 0
	if !bytes.HasPrefix(b, []byte(key)) {
		i = bytes.Index(b, []byte("\n"+key))
		if i < 0 {
			return 0, fmt.Errorf("host: no %s in %s", name, path)
		}
		i++
	}
	line := b[i+len(key):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	line = bytes.TrimSpace(line)
	num, unit, _ := bytes.Cut(line, []byte{' '})
	kb, err := strconv.ParseUint(string(num), 10, 64)
	if err != nil || string(unit) != "kB" {
		return 0, fmt.Errorf("host: cannot parse %s in %s: %q", name, path, line)
	}
	return kb << 10, nil
}

// hwm returns VmHWM, the kernel's high-water mark of this process's RSS
// since the process started or the mark was last reset (never below the
// current RSS).
func hwm() (uint64, error) { return statusField("VmHWM") }

// memInfo returns MemAvailable and MemTotal from /proc/meminfo.
func memInfo() (available, total uint64, err error) {
	// Both fields from one pread of the kept-open /proc/meminfo (a sweep
	// point reads them at every start and finish); gopsutil's estimate
	// where the kernel has no MemAvailable (< 3.14).
	a, err := meminfo.parse(func(b []byte) (uint64, error) {
		if total, err = kBValue(b, "MemTotal", meminfo.path); err != nil {
			return 0, err
		}
		return kBValue(b, "MemAvailable", meminfo.path)
	})
	if err == nil && total > 0 {
		return a, total, nil
	}
	v, err := mem.VirtualMemory()
	if err != nil {
		return 0, 0, err
	}
	if v.Total == 0 {
		return 0, 0, errors.New("host: no MemTotal in /proc/meminfo")
	}
	return v.Available, v.Total, nil
}

// Total returns the host's total RAM (MemTotal), or 0 if it cannot be read.
func Total() uint64 {
	_, t, _ := memInfo()
	return t
}

// Available returns the RAM available to new allocations without swapping
// (MemAvailable), or 0 if it cannot be read.
func Available() uint64 {
	a, _, _ := memInfo()
	return a
}

// HeapLive returns the Go heap's live bytes as of the last completed garbage
// collection (runtime/metrics "/gc/heap/live:bytes"); run runtime.GC first
// for a current figure. Tensor memory is not on the Go heap and is not
// included.
func HeapLive() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// Allowance returns the memory this process may still take without being
// killed, swapping or failing: MemAvailable, capped by the room left under
// the memory cgroup's limit and the address-space and data-segment limits
// (Room). 0 if nothing can be read.
func Allowance() uint64 {
	room, _ := Room()
	return room
}

// cgroupRoom returns the bytes left under this process's memory cgroup
// limit, and false when there is no limit or it cannot be read.
func cgroupRoom() (uint64, bool) {
	limit, used, ok := cgroupFigures()
	if !ok {
		return 0, false
	}
	if used >= limit {
		return 0, true
	}
	return limit - used, true
}

// cgroupLimit returns this process's memory cgroup limit, and false when
// there is none or it cannot be read.
func cgroupLimit() (uint64, bool) {
	limit, _, ok := cgroupFigures()
	return limit, ok
}

// cgroupFigures reads the memory cgroup's limit and usage (v2
// memory.max and memory.current, or v1's limit_in_bytes and
// usage_in_bytes).
func cgroupFigures() (limit, used uint64, ok bool) {
	read := func(path string) (uint64, bool) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, false
		}
		s := string(bytes.TrimSpace(b))
		if s == "max" {
			return 0, false
		}
		v, err := strconv.ParseUint(s, 10, 64)
		return v, err == nil
	}
	for _, p := range [][2]string{
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
	} {
		limit, ok := read(p[0])
		if !ok || limit >= 1<<62 { // v1 reports "no limit" as a huge number
			continue
		}
		used, ok := read(p[1])
		if !ok {
			continue
		}
		return limit, used, true
	}
	return 0, 0, false
}

// goMapped returns the memory Go's runtime has mapped
// ("/memory/classes/total:bytes").
func goMapped() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
