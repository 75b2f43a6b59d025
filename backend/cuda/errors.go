package cuda

import (
	"errors"
	"fmt"

	"github.com/memsh/memsh/backend"
)

// ErrUnavailable is wrapped by the errors that say the CUDA backend cannot
// be used on this machine: no libcuda.so.1, a driver without a needed
// entry point, cuInit failing (driver not loaded, no device), no device.
var ErrUnavailable = errors.New("CUDA driver unavailable")

// ErrNoBLAS is wrapped by the error of an operation that needs cuBLAS when
// libcublas could not be loaded.
var ErrNoBLAS = errors.New("cuBLAS unavailable")

// Error is a failed driver call.
type Error struct {
	Op      string // the call, e.g. "cuMemAlloc(2.00 GiB)"
	Code    int    // the CUresult
	Name    string // "CUDA_ERROR_OUT_OF_MEMORY"
	Message string // "out of memory"
}

func (e *Error) Error() string {
	switch {
	case e.Name != "" && e.Message != "":
		return fmt.Sprintf("%s: %s (%s)", e.Op, e.Message, e.Name)
	case e.Name != "":
		return fmt.Sprintf("%s: %s", e.Op, e.Name)
	}
	return fmt.Sprintf("%s: CUDA error %d", e.Op, e.Code)
}

// Unwrap makes an out-of-memory error match backend.ErrDeviceFull, so the
// caching allocator frees its cache and retries before reporting an OOM.
func (e *Error) Unwrap() error {
	if e.Code == codeOutOfMemory {
		return backend.ErrDeviceFull
	}
	return nil
}

// Sticky reports whether the error leaves the CUDA context unusable (a
// kernel fault): every later call in this process fails the same way.
func (e *Error) Sticky() bool {
	switch e.Code {
	case 700, 701, 702, 714, 715, 716, 717, 718, 719:
		return true
	}
	return false
}

const (
	codeOutOfMemory    = 2
	codeNotInitialized = 3
	codeNoDevice       = 100
)

// builtinErrorText names the codes memsh meets, for a driver that cannot
// name them itself.
func builtinErrorText(code int) (name, msg string) {
	switch code {
	case 1:
		return "CUDA_ERROR_INVALID_VALUE", "invalid argument"
	case codeOutOfMemory:
		return "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"
	case codeNotInitialized:
		return "CUDA_ERROR_NOT_INITIALIZED", "initialization error"
	case 34:
		return "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"
	case 35:
		return "CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA driver version is insufficient for CUDA runtime version"
	case codeNoDevice:
		return "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"
	case 101:
		return "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"
	case 200:
		return "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"
	case 201:
		return "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"
	case 218:
		return "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"
	case 400:
		return "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"
	case 500:
		return "CUDA_ERROR_NOT_FOUND", "named symbol not found"
	case 700:
		return "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"
	case 719:
		return "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"
	case 999:
		return "CUDA_ERROR_UNKNOWN", "unknown error"
	}
	return "", ""
}
