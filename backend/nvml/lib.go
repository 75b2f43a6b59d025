package nvml

import "fmt"

// Library is the part of NVML the gate uses, with go-nvml's method names
// and NVML's own types. Open implements it by loading NVIDIA's library at
// run time with purego (no cgo, no C header, so building memsh compiles no
// C and prints no compiler warnings); New also accepts go-nvml's mocks (see
// New).
type Library interface {
	Init() Return
	Shutdown() Return
	// LookupSymbol returns nil when the library has the C symbol.
	LookupSymbol(sym string) error
	SystemGetDriverVersion() (string, Return)
	SystemGetProcessName(pid int) (string, Return)
	DeviceGetCount() (int, Return)
	DeviceGetHandleByIndex(i int) (Handle, Return)
}

// Handle is an NVML device handle (a GPU or a MIG device).
type Handle interface {
	GetUUID() (string, Return)
	GetName() (string, Return)
	GetMemoryInfo() (MemoryV1, Return)
	GetMemoryInfo_v2() (MemoryV2, Return)
	GetComputeRunningProcesses() ([]ProcessInfo, Return)
	GetUtilizationRates() (Utilization, Return)
	GetMigMode() (current, pending int, r Return)
	GetMaxMigDeviceCount() (int, Return)
	GetMigDeviceHandleByIndex(i int) (Handle, Return)
}

// MemoryV1 is nvmlMemory_t.
type MemoryV1 struct{ Total, Free, Used uint64 }

// MemoryV2 is nvmlMemory_v2_t without its version field.
type MemoryV2 struct{ Total, Reserved, Free, Used uint64 }

// ProcessInfo is the part of nvmlProcessInfo_t the gate reads.
type ProcessInfo struct {
	Pid           uint32
	UsedGpuMemory uint64
}

// DeviceMIGEnable is NVML_DEVICE_MIG_ENABLE, a GetMigMode answer.
const DeviceMIGEnable = 1

// Return is nvmlReturn_t.
type Return int32

// NVML's return codes (nvml.h), spelled as go-nvml spells them.
const (
	SUCCESS                         Return = 0
	ERROR_UNINITIALIZED             Return = 1
	ERROR_INVALID_ARGUMENT          Return = 2
	ERROR_NOT_SUPPORTED             Return = 3
	ERROR_NO_PERMISSION             Return = 4
	ERROR_ALREADY_INITIALIZED       Return = 5
	ERROR_NOT_FOUND                 Return = 6
	ERROR_INSUFFICIENT_SIZE         Return = 7
	ERROR_INSUFFICIENT_POWER        Return = 8
	ERROR_DRIVER_NOT_LOADED         Return = 9
	ERROR_TIMEOUT                   Return = 10
	ERROR_IRQ_ISSUE                 Return = 11
	ERROR_LIBRARY_NOT_FOUND         Return = 12
	ERROR_FUNCTION_NOT_FOUND        Return = 13
	ERROR_CORRUPTED_INFOROM         Return = 14
	ERROR_GPU_IS_LOST               Return = 15
	ERROR_RESET_REQUIRED            Return = 16
	ERROR_OPERATING_SYSTEM          Return = 17
	ERROR_LIB_RM_VERSION_MISMATCH   Return = 18
	ERROR_IN_USE                    Return = 19
	ERROR_MEMORY                    Return = 20
	ERROR_NO_DATA                   Return = 21
	ERROR_VGPU_ECC_NOT_SUPPORTED    Return = 22
	ERROR_INSUFFICIENT_RESOURCES    Return = 23
	ERROR_FREQ_NOT_SUPPORTED        Return = 24
	ERROR_ARGUMENT_VERSION_MISMATCH Return = 25
	ERROR_DEPRECATED                Return = 26
	ERROR_NOT_READY                 Return = 27
	ERROR_GPU_NOT_FOUND             Return = 28
	ERROR_INVALID_STATE             Return = 29
	ERROR_UNKNOWN                   Return = 999
)

var returnNames = map[Return]string{
	SUCCESS: "SUCCESS", ERROR_UNINITIALIZED: "ERROR_UNINITIALIZED", ERROR_INVALID_ARGUMENT: "ERROR_INVALID_ARGUMENT",
	ERROR_NOT_SUPPORTED: "ERROR_NOT_SUPPORTED", ERROR_NO_PERMISSION: "ERROR_NO_PERMISSION",
	ERROR_ALREADY_INITIALIZED: "ERROR_ALREADY_INITIALIZED", ERROR_NOT_FOUND: "ERROR_NOT_FOUND",
	ERROR_INSUFFICIENT_SIZE: "ERROR_INSUFFICIENT_SIZE", ERROR_INSUFFICIENT_POWER: "ERROR_INSUFFICIENT_POWER",
	ERROR_DRIVER_NOT_LOADED: "ERROR_DRIVER_NOT_LOADED", ERROR_TIMEOUT: "ERROR_TIMEOUT", ERROR_IRQ_ISSUE: "ERROR_IRQ_ISSUE",
	ERROR_LIBRARY_NOT_FOUND: "ERROR_LIBRARY_NOT_FOUND", ERROR_FUNCTION_NOT_FOUND: "ERROR_FUNCTION_NOT_FOUND",
	ERROR_CORRUPTED_INFOROM: "ERROR_CORRUPTED_INFOROM", ERROR_GPU_IS_LOST: "ERROR_GPU_IS_LOST",
	ERROR_RESET_REQUIRED: "ERROR_RESET_REQUIRED", ERROR_OPERATING_SYSTEM: "ERROR_OPERATING_SYSTEM",
	ERROR_LIB_RM_VERSION_MISMATCH: "ERROR_LIB_RM_VERSION_MISMATCH", ERROR_IN_USE: "ERROR_IN_USE",
	ERROR_MEMORY: "ERROR_MEMORY", ERROR_NO_DATA: "ERROR_NO_DATA", ERROR_VGPU_ECC_NOT_SUPPORTED: "ERROR_VGPU_ECC_NOT_SUPPORTED",
	ERROR_INSUFFICIENT_RESOURCES: "ERROR_INSUFFICIENT_RESOURCES", ERROR_FREQ_NOT_SUPPORTED: "ERROR_FREQ_NOT_SUPPORTED",
	ERROR_ARGUMENT_VERSION_MISMATCH: "ERROR_ARGUMENT_VERSION_MISMATCH", ERROR_DEPRECATED: "ERROR_DEPRECATED",
	ERROR_NOT_READY: "ERROR_NOT_READY", ERROR_GPU_NOT_FOUND: "ERROR_GPU_NOT_FOUND", ERROR_INVALID_STATE: "ERROR_INVALID_STATE",
	ERROR_UNKNOWN: "ERROR_UNKNOWN",
}

// Error names the code as nvml.h does (go-nvml's spelling).
func (r Return) Error() string {
	if s, ok := returnNames[r]; ok {
		return s
	}
	return fmt.Sprintf("unknown return value: %d", int32(r))
}

func (r Return) String() string { return r.Error() }
