package nvml

import (
	"fmt"
	"os"
	"strings"
)

// Device is one GPU, or one MIG device of a GPU, as NVML sees it. Its
// queries go through the Gate that found it.
type Device struct {
	g      *Gate
	h      Handle
	Index  int     // NVML index of the GPU (of the parent GPU for a MIG device)
	MIG    int     // MIG slot on the parent GPU, or -1 for a whole GPU
	UUID   string  // "GPU-8c0b..." or "MIG-..."
	Name   string  // "NVIDIA H200", "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
	Parent *Device // the GPU a MIG device belongs to, nil for a GPU
}

// Memory is a device's memory as NVML reports it, in bytes.
type Memory struct {
	Total uint64
	Free  uint64
	// Used is NVML's used memory: with the v2 query it excludes Reserved;
	// with v1 it is what is not free.
	Used uint64
	// Reserved is memory the driver sets aside (v2 query only; 0 with v1).
	Reserved uint64
	// V2 reports whether the v2 query produced these figures.
	V2 bool
}

// Process is one process using a device.
type Process struct {
	PID uint32
	// Used is the process's device memory, valid when UsedKnown. NVML
	// cannot always tell (Windows WDDM, some containers); a figure larger
	// than the device is treated as unknown.
	Used      uint64
	UsedKnown bool
	Name      string // from NVML, "" when unknown
	Self      bool   // the calling process (false in a container whose PID namespace NVML does not share)
}

// Utilization is the percentage of time over NVML's last sample period
// during which kernels ran (GPU) and device memory was read or written
// (Memory).
type Utilization struct {
	GPU, Memory uint32
}

// Devices returns every GPU of the machine in NVML index order (not MIG
// devices; see Device.MIGDevices).
func (g *Gate) Devices() ([]*Device, error) {
	n, err := g.Count()
	if err != nil {
		return nil, err
	}
	out := make([]*Device, 0, n)
	for i := range n {
		d, err := g.Device(i)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// Device returns the GPU with NVML index i.
func (g *Gate) Device(i int) (*Device, error) {
	d := &Device{g: g, Index: i, MIG: -1}
	err := g.call(func(lib Library) error {
		h, r := lib.DeviceGetHandleByIndex(i)
		if err := retErr(fmt.Sprintf("nvmlDeviceGetHandleByIndex(%d)", i), r); err != nil {
			return err
		}
		d.h = h
		return d.describe()
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// describe fills UUID and Name. The gate must be held.
func (d *Device) describe() error {
	uuid, r := d.h.GetUUID()
	if err := retErr("nvmlDeviceGetUUID", r); err != nil {
		return err
	}
	d.UUID = uuid
	name, r := d.h.GetName()
	switch {
	case r == SUCCESS:
		d.Name = name
	case d.Parent != nil:
		d.Name = d.Parent.Name + " MIG" // older drivers cannot name MIG devices
	default:
		return retErr("nvmlDeviceGetName", r)
	}
	return nil
}

// MIGDevices returns the MIG devices of a GPU in MIG mode, each with its
// own UUID and memory; none for a GPU not in MIG mode or a driver without
// MIG.
func (d *Device) MIGDevices() ([]*Device, error) {
	if d.Parent != nil {
		return nil, nil
	}
	var out []*Device
	err := d.g.call(func(Library) error {
		for _, sym := range []string{"nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex"} {
			if d.g.missing[sym] {
				return nil // a driver without MIG
			}
		}
		cur, _, r := d.h.GetMigMode()
		if r == ERROR_NOT_SUPPORTED || (r == SUCCESS && cur != DeviceMIGEnable) {
			return nil
		}
		if err := retErr("nvmlDeviceGetMigMode", r); err != nil {
			return err
		}
		n, r := d.h.GetMaxMigDeviceCount()
		if err := retErr("nvmlDeviceGetMaxMigDeviceCount", r); err != nil {
			return err
		}
		for i := range n {
			h, r := d.h.GetMigDeviceHandleByIndex(i)
			if r == ERROR_NOT_FOUND || r == ERROR_INVALID_ARGUMENT {
				continue // an empty slot
			}
			if err := retErr(fmt.Sprintf("nvmlDeviceGetMigDeviceHandleByIndex(%d)", i), r); err != nil {
				return err
			}
			m := &Device{g: d.g, h: h, Index: d.Index, MIG: i, Parent: d}
			if err := m.describe(); err != nil {
				return err
			}
			out = append(out, m)
		}
		return nil
	})
	return out, err
}

// NormalizeUUID returns the comparable form of a GPU or MIG UUID: lower
// case, without the "GPU-" or "MIG-" prefix. CUDA and NVML spell the same
// device this way.
func NormalizeUUID(uuid string) string {
	u := strings.ToLower(strings.TrimSpace(uuid))
	for _, p := range []string{"gpu-", "mig-"} {
		u = strings.TrimPrefix(u, p)
	}
	return u
}

// ByUUID returns the GPU or MIG device with the given UUID (compared with
// NormalizeUUID, so CUDA's "GPU-..." form of a MIG device matches too).
func (g *Gate) ByUUID(uuid string) (*Device, error) {
	want := NormalizeUUID(uuid)
	gpus, err := g.Devices()
	if err != nil {
		return nil, err
	}
	for _, d := range gpus {
		if NormalizeUUID(d.UUID) == want {
			return d, nil
		}
	}
	for _, d := range gpus {
		migs, err := d.MIGDevices()
		if err != nil {
			continue // a GPU whose MIG state cannot be read has no match for us
		}
		for _, m := range migs {
			if NormalizeUUID(m.UUID) == want {
				return m, nil
			}
		}
	}
	return nil, fmt.Errorf("nvml: no device with UUID %s", uuid)
}

// Gate returns the gate the device's queries go through.
func (d *Device) Gate() *Gate { return d.g }

// String names the device: "GPU 0 (NVIDIA H200)", "GPU 0 MIG 1 (...)".
func (d *Device) String() string {
	if d.Parent != nil {
		return fmt.Sprintf("GPU %d MIG %d (%s)", d.Index, d.MIG, d.Name)
	}
	return fmt.Sprintf("GPU %d (%s)", d.Index, d.Name)
}

// Memory returns the device's memory. It uses the v2 query (which also
// reports Reserved) when the library has it and it works, else v1.
func (d *Device) Memory() (Memory, error) {
	var m Memory
	err := d.g.call(func(Library) error {
		if d.g.hasV2 && !d.g.v2Fail {
			v, r := d.h.GetMemoryInfo_v2()
			if r == SUCCESS {
				m = Memory{Total: v.Total, Free: v.Free, Used: v.Used, Reserved: v.Reserved, V2: true}
				return nil
			}
			if r != ERROR_NOT_SUPPORTED && r != ERROR_ARGUMENT_VERSION_MISMATCH && r != ERROR_FUNCTION_NOT_FOUND {
				return retErr("nvmlDeviceGetMemoryInfo_v2", r)
			}
			d.g.v2Fail = true // an older driver: v1 from now on
		}
		v, r := d.h.GetMemoryInfo()
		if err := retErr("nvmlDeviceGetMemoryInfo", r); err != nil {
			return err
		}
		m = Memory{Total: v.Total, Free: v.Free, Used: v.Used}
		return nil
	})
	if err == nil && (m.Free > m.Total || m.Used > m.Total) {
		return Memory{}, fmt.Errorf("nvml: %s reports inconsistent memory (total %d, free %d, used %d)", d, m.Total, m.Free, m.Used)
	}
	return m, err
}

// notAvailable is NVML's NVML_VALUE_NOT_AVAILABLE for unsigned long long.
const notAvailable = ^uint64(0)

// Processes returns the compute processes using the device. Entries with
// pid 0 are dropped; a memory figure NVML cannot give, or larger than the
// device, is marked unknown. In a container NVML may list host pids, or
// none.
func (d *Device) Processes() ([]Process, error) {
	mem, err := d.Memory()
	if err != nil {
		return nil, err
	}
	var infos []ProcessInfo
	err = d.g.call(func(Library) error {
		if err := d.g.need("nvmlDeviceGetComputeRunningProcesses"); err != nil {
			return err
		}
		var r Return
		infos, r = d.h.GetComputeRunningProcesses()
		return retErr("nvmlDeviceGetComputeRunningProcesses", r)
	})
	if err != nil {
		return nil, err
	}
	self := uint32(os.Getpid())
	out := make([]Process, 0, len(infos))
	for _, in := range infos {
		if in.Pid == 0 {
			continue
		}
		p := Process{PID: in.Pid, Self: in.Pid == self}
		if in.UsedGpuMemory != notAvailable && in.UsedGpuMemory <= mem.Total {
			p.Used, p.UsedKnown = in.UsedGpuMemory, true
		}
		p.Name = d.g.ProcessName(in.Pid)
		out = append(out, p)
	}
	return out, nil
}

// Utilization returns the device's utilization rates (not supported on MIG
// devices: see IsNotSupported).
func (d *Device) Utilization() (Utilization, error) {
	var u Utilization
	err := d.g.call(func(Library) error {
		if err := d.g.need("nvmlDeviceGetUtilizationRates"); err != nil {
			return err
		}
		v, r := d.h.GetUtilizationRates()
		if err := retErr("nvmlDeviceGetUtilizationRates", r); err != nil {
			return err
		}
		u = v
		return nil
	})
	return u, err
}
