package gpu

import (
	"fmt"
	"os"
	"time"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/cuda"
	"github.com/memsh/memsh/backend/nvml"
	"github.com/memsh/memsh/backend/sim"
)

// The figures of one device, from wherever its backend gets them: NVML (a
// real GPU with NVML), the driver (a real GPU without NVML), the simulator,
// or Device.MemGetInfo for any other backend.

// memory is a device's device-wide memory, in bytes.
type memory struct {
	total, free uint64
	used        uint64 // total - free
	source      string // "nvml", "driver" or "sim"
}

func memoryOf(d backend.Device) (memory, error) {
	if c, ok := d.(*cuda.Device); ok {
		if v := c.NVML(); v != nil {
			m, err := v.Memory()
			if err != nil {
				return memory{}, err
			}
			return memory{total: m.Total, free: m.Free, used: m.Total - m.Free, source: "nvml"}, nil
		}
	}
	free, total, err := d.MemGetInfo()
	if err != nil {
		return memory{}, err
	}
	src := "driver"
	if d.Kind() == "sim" {
		src = "sim"
	}
	return memory{total: total, free: free, used: total - free, source: src}, nil
}

// process is one process using a device.
type process struct {
	pid       uint32
	used      uint64
	usedKnown bool
	name      string
	self      bool
}

func processesOf(d backend.Device) ([]process, error) {
	switch d := d.(type) {
	case *cuda.Device:
		v := d.NVML()
		if v == nil {
			return nil, fmt.Errorf("%s: per-process figures need NVML: %v", d.Name(), nvmlReason())
		}
		ps, err := v.Processes()
		if err != nil {
			return nil, err
		}
		out := make([]process, len(ps))
		for i, p := range ps {
			out[i] = process{pid: p.PID, used: p.Used, usedKnown: p.UsedKnown, name: p.Name, self: p.Self}
		}
		return out, nil
	case *sim.Device:
		// The simulated device is this process's alone: its context and
		// what the allocator holds.
		used := d.Spec().Ctx + d.Used()
		if used == 0 {
			return nil, nil
		}
		return []process{{pid: uint32(os.Getpid()), used: used, usedKnown: true, name: "memsh", self: true}}, nil
	}
	return nil, fmt.Errorf("%s: the %s backend has no per-process figures", d.Name(), d.Kind())
}

// nvmlReason says why a real GPU has no NVML view.
func nvmlReason() error {
	if err := nvml.Default().Err(); err != nil {
		return err
	}
	return fmt.Errorf("NVML has no device with this UUID")
}

// preloadResult is what creating a device's context cost.
type preloadResult struct {
	created   bool          // this call created it
	bytes     uint64        // device memory it took
	known     bool          // bytes is known
	seconds   time.Duration // how long it took
	workspace uint64        // of bytes, memsh's own workspace
	source    string
}

func preloadDevice(d backend.Device) (preloadResult, error) {
	switch d := d.(type) {
	case *cuda.Device:
		if d.HasContext() {
			info, err := d.Context()
			return preloadResult{seconds: info.Time, workspace: info.Workspace, source: "already created"}, err
		}
		v := d.NVML()
		var before nvml.Memory
		var err error
		if v != nil {
			if before, err = v.Memory(); err != nil {
				v = nil
			}
		}
		info, err := d.Context()
		if err != nil {
			return preloadResult{}, err
		}
		r := preloadResult{created: true, seconds: info.Time, workspace: info.Workspace}
		if v != nil {
			if after, err := v.Memory(); err == nil && after.Free <= before.Free {
				r.bytes, r.known, r.source = before.Free-after.Free, true, "nvml: device free memory before and after"
				return r, nil
			}
		}
		// Without NVML there is no figure from before the context: report
		// what the device uses now (other processes included).
		free, total, err := d.MemGetInfo()
		if err != nil {
			return preloadResult{}, err
		}
		r.bytes, r.known, r.source = total-free, true, "driver: device-wide used memory after creating the context"
		return r, nil
	case *sim.Device:
		return preloadResult{bytes: d.Spec().Ctx, known: true, source: "sim: the spec's ctx="}, nil
	}
	return preloadResult{source: d.Kind() + ": no context"}, nil
}
