// Package nvml is memsh's view of NVIDIA's management library (NVML,
// loaded at run time and called through purego; go-nvml's mocks serve the
// tests): the GPUs of the machine with their
// names and UUIDs, device-wide total / free / used memory (and reserved
// memory where NVML's v2 memory query exists), the memory each process uses,
// utilization, and MIG devices with their own memory.
//
// Every NVML call goes through one gate object, a *Gate. An NVML call made
// while the library is not loaded and initialised jumps through a null
// function pointer and kills the process, so the Gate makes no call at all
// unless nvml.Init succeeded, and none after Close. A Gate over a machine
// without NVIDIA's library (or without a driver, or without GPUs) is simply
// unavailable: every method returns an error wrapping ErrUnavailable that
// says why, and nothing crashes.
//
// The figures are device-wide: they include other processes and the CUDA
// context, unlike the caching allocator's figures. All sizes are in bytes.
//
// CUDA ordinals and NVML indices differ (CUDA_VISIBLE_DEVICES renumbers
// CUDA's devices, NVML ignores it); ByUUID maps a CUDA device to its NVML
// device by UUID, which both report.
package nvml

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/ebitengine/purego"
)

// ErrUnavailable is wrapped by every error of a Gate whose NVML library
// could not be loaded or initialised, or that was closed.
var ErrUnavailable = errors.New("NVML unavailable")

// LibraryEnv names the environment variable that overrides the path of the
// NVML library the Default gate loads (default libnvidia-ml.so.1).
const LibraryEnv = "MEMSH_LIBNVML"

// memoryV2Symbol is the C symbol of the v2 memory query.
const memoryV2Symbol = "nvmlDeviceGetMemoryInfo_v2"

// Gate is the one way memsh calls NVML. It is safe for concurrent use; calls
// are serialised.
type Gate struct {
	mu     sync.Mutex
	lib    Library
	ok     bool  // Init succeeded and Close has not run
	err    error // why the gate is closed
	hasV2  bool  // nvmlDeviceGetMemoryInfo_v2 exists in the library
	v2Fail bool  // the v2 query failed once; use v1 from then on
	// missing lists the optional entry points the library lacks (an old
	// driver): calling one would jump through a null pointer.
	missing map[string]bool
}

// requiredSymbols are the entry points without which the gate is
// unavailable; each entry lists acceptable versions.
var requiredSymbols = [][]string{
	{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"},
	{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"},
	{"nvmlDeviceGetUUID"},
	{"nvmlDeviceGetName"},
	{"nvmlDeviceGetMemoryInfo"},
}

// optionalSymbols are checked once; a query needing a missing one fails
// with an error instead of being called.
var optionalSymbols = []string{
	"nvmlSystemGetDriverVersion", "nvmlSystemGetProcessName", "nvmlDeviceGetUtilizationRates",
	"nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
	"nvmlDeviceGetMigDeviceHandleByIndex",
}

// New returns a gate over lib and initialises NVML through it. When Init
// fails the gate is unavailable (see Err) and lib is never called again.
// lib is a Library, or a value with go-nvml's nvml.Interface method set
// such as go-nvml's mocks (adapted by reflection: this package does not
// import go-nvml, see asLibrary).
func New(lib any) *Gate {
	g := &Gate{}
	if lib == nil {
		g.err = fmt.Errorf("%w: no library", ErrUnavailable)
		return g
	}
	l, err := asLibrary(lib)
	if err != nil {
		g.err = fmt.Errorf("%w: %v", ErrUnavailable, err)
		return g
	}
	g.lib = l
	return g.init()
}

// init initialises NVML through g.lib.
func (g *Gate) init() *Gate {
	lib := g.lib
	if r := lib.Init(); r != SUCCESS {
		g.err = fmt.Errorf("%w: nvmlInit: %s", ErrUnavailable, initReason(r))
		return g
	}
	for _, alts := range requiredSymbols {
		found := false
		for _, sym := range alts {
			found = found || lib.LookupSymbol(sym) == nil
		}
		if !found {
			g.err = fmt.Errorf("%w: the NVML library has no %s (a driver too old for memsh)", ErrUnavailable, alts[len(alts)-1])
			_ = lib.Shutdown()
			return g
		}
	}
	g.missing = map[string]bool{}
	for _, sym := range optionalSymbols {
		if lib.LookupSymbol(sym) != nil {
			g.missing[sym] = true
		}
	}
	g.ok = true
	g.hasV2 = lib.LookupSymbol(memoryV2Symbol) == nil
	return g
}

// need returns an error when the library lacks an optional entry point
// (the gate is held).
func (g *Gate) need(sym string) error {
	if g.missing[sym] {
		return &Error{Op: sym, Code: ERROR_FUNCTION_NOT_FOUND}
	}
	return nil
}

// initReason explains an Init failure.
func initReason(r Return) string {
	switch r {
	case ERROR_LIBRARY_NOT_FOUND:
		return "libnvidia-ml.so.1 not found (no NVIDIA driver installed?)"
	case ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded"
	case ERROR_NO_PERMISSION:
		return "no permission to talk to the NVIDIA driver"
	}
	return r.Error()
}

// DefaultLibrary is the NVML library Open loads when given no path.
const DefaultLibrary = "libnvidia-ml.so.1"

// entrySymbols are the entry points the gate needs before it can look
// symbols up through the library itself (Init, Shutdown, and error strings).
var entrySymbols = [][]string{{"nvmlInit_v2"}, {"nvmlShutdown"}, {"nvmlErrorString"}}

// Open returns a gate over the NVML library at path ("" for the system's
// libnvidia-ml.so.1), loaded at run time. The library is first probed with
// dlopen/dlsym for every entry point the gate needs, so a library that
// lacks one (not NVML, or a driver too old) leaves the gate unavailable
// before anything is called. NVML is then called through purego (see
// dlLibrary): no cgo, so building memsh compiles no NVML header.
func Open(path string) *Gate {
	lib := path
	if lib == "" {
		lib = DefaultLibrary
	}
	if err := probe(lib); err != nil {
		return &Gate{err: fmt.Errorf("%w: %v", ErrUnavailable, err)}
	}
	l, err := dlopen(lib)
	if err != nil {
		return &Gate{err: fmt.Errorf("%w: %s not loadable: %v", ErrUnavailable, lib, err)}
	}
	return (&Gate{lib: l}).init()
}

var (
	defaultOnce sync.Once
	defaultGate *Gate
)

// Default returns the process-wide gate over the system's NVML library (or
// the one $MEMSH_LIBNVML names), opened on first use and never closed: NVML
// is a property of the process, like the driver.
func Default() *Gate {
	defaultOnce.Do(func() { defaultGate = Open(os.Getenv(LibraryEnv)) })
	return defaultGate
}

// Available reports whether NVML calls can be made.
func (g *Gate) Available() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ok
}

// Err returns why the gate is unavailable (wrapping ErrUnavailable), or nil.
func (g *Gate) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ok {
		return nil
	}
	return g.err
}

// HasMemoryV2 reports whether the library has the v2 memory query, which
// also reports the memory the driver reserves.
func (g *Gate) HasMemoryV2() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ok && g.hasV2
}

// Close shuts NVML down (once); the gate is unavailable afterwards and its
// Devices must not be used.
func (g *Gate) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.ok {
		return
	}
	g.ok = false
	g.err = fmt.Errorf("%w: the NVML gate was closed", ErrUnavailable)
	_ = g.lib.Shutdown()
}

// call runs f with the library if the gate is open, serialised. It is the
// only place the library is reached.
func (g *Gate) call(f func(lib Library) error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.ok {
		return g.err
	}
	return f(g.lib)
}

// retErr converts an NVML return code to an error naming the query.
func retErr(what string, r Return) error {
	if r == SUCCESS {
		return nil
	}
	return &Error{Op: what, Code: r}
}

// Error is a failed NVML query.
type Error struct {
	Op   string // the query, e.g. "nvmlDeviceGetMemoryInfo"
	Code Return // NVML's return code
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Op, e.Code.Error()) }

// IsNotSupported reports whether err is NVML's "not supported" answer (a
// query the device or driver does not offer, such as utilization of a MIG
// device).
func IsNotSupported(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == ERROR_NOT_SUPPORTED
}

// DriverVersion returns the driver's version string, such as "550.54.15".
func (g *Gate) DriverVersion() (string, error) {
	var v string
	err := g.call(func(lib Library) error {
		if err := g.need("nvmlSystemGetDriverVersion"); err != nil {
			return err
		}
		var r Return
		v, r = lib.SystemGetDriverVersion()
		return retErr("nvmlSystemGetDriverVersion", r)
	})
	return v, err
}

// Count returns the number of GPUs NVML sees (all of the machine's GPUs:
// NVML ignores CUDA_VISIBLE_DEVICES).
func (g *Gate) Count() (int, error) {
	var n int
	err := g.call(func(lib Library) error {
		var r Return
		n, r = lib.DeviceGetCount()
		return retErr("nvmlDeviceGetCount", r)
	})
	return n, err
}

// ProcessName returns the name of a process as NVML knows it, or "" when
// NVML cannot tell (a pid from another PID namespace, for instance).
func (g *Gate) ProcessName(pid uint32) string {
	var name string
	_ = g.call(func(lib Library) error {
		if g.need("nvmlSystemGetProcessName") != nil {
			return nil
		}
		n, r := lib.SystemGetProcessName(int(pid))
		if r == SUCCESS {
			name = n
		}
		return nil
	})
	return name
}

// probe checks that the library at path loads and has every entry point the
// gate calls unconditionally.
func probe(path string) error {
	h, err := purego.Dlopen(path, purego.RTLD_LAZY|purego.RTLD_LOCAL)
	if err != nil {
		return fmt.Errorf("%s not found or not loadable (no NVIDIA driver installed?): %v", path, err)
	}
	defer purego.Dlclose(h)
	for _, alts := range append(append([][]string(nil), entrySymbols...), requiredSymbols...) {
		found := false
		for _, sym := range alts {
			if _, err := purego.Dlsym(h, sym); err == nil {
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("%s has no %s (not NVML, or a driver too old for memsh)", path, alts[0])
		}
	}
	return nil
}
