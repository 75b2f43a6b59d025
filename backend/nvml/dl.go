package nvml

import (
	"unsafe"

	"github.com/ebitengine/purego"
)

// dlLibrary is NVML loaded with dlopen and called through purego: the
// dozen entry points the gate uses, each looked up once, the newest
// version first as nvml.h's macros would pick it. An entry point the
// library lacks stays nil and answers ERROR_FUNCTION_NOT_FOUND.
type dlLibrary struct {
	h uintptr

	init, shutdown     func() Return
	driverVersion      func(buf *byte, n uint32) Return
	processName        func(pid uint32, buf *byte, n uint32) Return
	count              func(n *uint32) Return
	handleByIndex      func(i uint32, dev *uintptr) Return
	uuid, name         func(dev uintptr, buf *byte, n uint32) Return
	memory             func(dev uintptr, m *MemoryV1) Return
	memoryV2           func(dev uintptr, m *memoryV2C) Return
	processes          func(dev uintptr, n *uint32, infos *byte) Return
	processInfoSize    uintptr
	utilization        func(dev uintptr, u *Utilization) Return
	migMode            func(dev uintptr, cur, pending *uint32) Return
	maxMigCount        func(dev uintptr, n *uint32) Return
	migHandleByIndex   func(dev uintptr, i uint32, mig *uintptr) Return
	registeredVersions map[string]string
}

// memoryV2C is nvmlMemory_v2_t.
type memoryV2C struct {
	version                     uint32
	_                           uint32
	total, reserved, free, used uint64
}

// nvmlMemory_v2 is NVML_STRUCT_VERSION(Memory, 2).
const nvmlMemory_v2 = uint32(unsafe.Sizeof(memoryV2C{})) | 2<<24

// dlopen loads the library at path.
func dlopen(path string) (*dlLibrary, error) {
	h, err := purego.Dlopen(path, purego.RTLD_LAZY|purego.RTLD_LOCAL)
	if err != nil {
		return nil, err
	}
	l := &dlLibrary{h: h, registeredVersions: map[string]string{}}
	bind := func(fn any, syms ...string) {
		for _, s := range syms {
			if p, err := purego.Dlsym(h, s); err == nil && p != 0 {
				purego.RegisterFunc(fn, p)
				l.registeredVersions[syms[len(syms)-1]] = s
				return
			}
		}
	}
	bind(&l.init, "nvmlInit_v2")
	bind(&l.shutdown, "nvmlShutdown")
	bind(&l.driverVersion, "nvmlSystemGetDriverVersion")
	bind(&l.processName, "nvmlSystemGetProcessName")
	bind(&l.count, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount")
	bind(&l.handleByIndex, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex")
	bind(&l.uuid, "nvmlDeviceGetUUID")
	bind(&l.name, "nvmlDeviceGetName")
	bind(&l.memory, "nvmlDeviceGetMemoryInfo")
	bind(&l.memoryV2, memoryV2Symbol)
	// nvmlProcessInfo_t is 24 bytes from v2 on (pid, usedGpuMemory,
	// gpuInstanceId, computeInstanceId), 16 bytes in v1.
	bind(&l.processes, "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses")
	l.processInfoSize = 24
	if l.registeredVersions["nvmlDeviceGetComputeRunningProcesses"] == "nvmlDeviceGetComputeRunningProcesses" {
		l.processInfoSize = 16
	}
	bind(&l.utilization, "nvmlDeviceGetUtilizationRates")
	bind(&l.migMode, "nvmlDeviceGetMigMode")
	bind(&l.maxMigCount, "nvmlDeviceGetMaxMigDeviceCount")
	bind(&l.migHandleByIndex, "nvmlDeviceGetMigDeviceHandleByIndex")
	return l, nil
}

func (l *dlLibrary) Init() Return {
	if l.init == nil {
		return ERROR_FUNCTION_NOT_FOUND
	}
	return l.init()
}

func (l *dlLibrary) Shutdown() Return {
	if l.shutdown == nil {
		return ERROR_FUNCTION_NOT_FOUND
	}
	return l.shutdown()
}

func (l *dlLibrary) LookupSymbol(sym string) error {
	_, err := purego.Dlsym(l.h, sym)
	return err
}

// cstring reads a NUL-terminated string from buf.
func cstring(buf []byte) string {
	for i, c := range buf {
		if c == 0 {
			return string(buf[:i])
		}
	}
	return string(buf)
}

// str calls f with a buffer of n bytes and returns what it wrote.
func str(n uint32, f func(buf *byte, n uint32) Return) (string, Return) {
	buf := make([]byte, n)
	r := f(&buf[0], n)
	if r != SUCCESS {
		return "", r
	}
	return cstring(buf), r
}

func (l *dlLibrary) SystemGetDriverVersion() (string, Return) {
	if l.driverVersion == nil {
		return "", ERROR_FUNCTION_NOT_FOUND
	}
	return str(80, l.driverVersion) // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
}

func (l *dlLibrary) SystemGetProcessName(pid int) (string, Return) {
	if l.processName == nil {
		return "", ERROR_FUNCTION_NOT_FOUND
	}
	return str(1024, func(b *byte, n uint32) Return { return l.processName(uint32(pid), b, n) })
}

func (l *dlLibrary) DeviceGetCount() (int, Return) {
	var n uint32
	if l.count == nil {
		return 0, ERROR_FUNCTION_NOT_FOUND
	}
	r := l.count(&n)
	return int(n), r
}

func (l *dlLibrary) DeviceGetHandleByIndex(i int) (Handle, Return) {
	var h uintptr
	if l.handleByIndex == nil {
		return nil, ERROR_FUNCTION_NOT_FOUND
	}
	if r := l.handleByIndex(uint32(i), &h); r != SUCCESS {
		return nil, r
	}
	return dlDevice{l, h}, SUCCESS
}

// dlDevice is an nvmlDevice_t of a dlLibrary.
type dlDevice struct {
	l *dlLibrary
	h uintptr
}

func (d dlDevice) GetUUID() (string, Return) {
	if d.l.uuid == nil {
		return "", ERROR_FUNCTION_NOT_FOUND
	}
	return str(96, func(b *byte, n uint32) Return { return d.l.uuid(d.h, b, n) }) // NVML_DEVICE_UUID_V2_BUFFER_SIZE
}

func (d dlDevice) GetName() (string, Return) {
	if d.l.name == nil {
		return "", ERROR_FUNCTION_NOT_FOUND
	}
	return str(96, func(b *byte, n uint32) Return { return d.l.name(d.h, b, n) }) // NVML_DEVICE_NAME_V2_BUFFER_SIZE
}

func (d dlDevice) GetMemoryInfo() (MemoryV1, Return) {
	var m MemoryV1
	if d.l.memory == nil {
		return m, ERROR_FUNCTION_NOT_FOUND
	}
	r := d.l.memory(d.h, &m)
	return m, r
}

func (d dlDevice) GetMemoryInfo_v2() (MemoryV2, Return) {
	if d.l.memoryV2 == nil {
		return MemoryV2{}, ERROR_FUNCTION_NOT_FOUND
	}
	m := memoryV2C{version: nvmlMemory_v2}
	r := d.l.memoryV2(d.h, &m)
	return MemoryV2{Total: m.total, Reserved: m.reserved, Free: m.free, Used: m.used}, r
}

func (d dlDevice) GetComputeRunningProcesses() ([]ProcessInfo, Return) {
	if d.l.processes == nil {
		return nil, ERROR_FUNCTION_NOT_FOUND
	}
	size := d.l.processInfoSize
	var n uint32
	for range 4 { // the count can grow between the calls
		buf := make([]byte, (uintptr(n)+1)*size)
		c := n + 1
		r := d.l.processes(d.h, &c, &buf[0])
		if r == ERROR_INSUFFICIENT_SIZE {
			n = c + 8
			continue
		}
		if r != SUCCESS {
			return nil, r
		}
		out := make([]ProcessInfo, c)
		for i := range out {
			rec := buf[uintptr(i)*size:]
			out[i] = ProcessInfo{
				Pid:           *(*uint32)(unsafe.Pointer(&rec[0])),
				UsedGpuMemory: *(*uint64)(unsafe.Pointer(&rec[8])),
			}
		}
		return out, SUCCESS
	}
	return nil, ERROR_INSUFFICIENT_SIZE
}

func (d dlDevice) GetUtilizationRates() (Utilization, Return) {
	var u Utilization
	if d.l.utilization == nil {
		return u, ERROR_FUNCTION_NOT_FOUND
	}
	r := d.l.utilization(d.h, &u)
	return u, r
}

func (d dlDevice) GetMigMode() (int, int, Return) {
	var cur, pending uint32
	if d.l.migMode == nil {
		return 0, 0, ERROR_FUNCTION_NOT_FOUND
	}
	r := d.l.migMode(d.h, &cur, &pending)
	return int(cur), int(pending), r
}

func (d dlDevice) GetMaxMigDeviceCount() (int, Return) {
	var n uint32
	if d.l.maxMigCount == nil {
		return 0, ERROR_FUNCTION_NOT_FOUND
	}
	r := d.l.maxMigCount(d.h, &n)
	return int(n), r
}

func (d dlDevice) GetMigDeviceHandleByIndex(i int) (Handle, Return) {
	var h uintptr
	if d.l.migHandleByIndex == nil {
		return nil, ERROR_FUNCTION_NOT_FOUND
	}
	if r := d.l.migHandleByIndex(d.h, uint32(i), &h); r != SUCCESS {
		return nil, r
	}
	return dlDevice{d.l, h}, SUCCESS
}
