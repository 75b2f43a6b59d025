package scope

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/cuda"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/nvml"
	"github.com/memsh/memsh/backend/sim"
)

// DeviceOptions name the system libraries OpenDevicesWith uses; zero values
// mean the defaults.
type DeviceOptions struct {
	// CUDALibrary is the driver library's path ("" means $MEMSH_LIBCUDA or
	// libcuda.so.1).
	CUDALibrary string
	// NVML is the gate for NVML's views of the GPUs (nil means
	// nvml.Default(), the system's libnvidia-ml).
	NVML *nvml.Gate
}

// OpenDevices opens the GPU devices a --device value selects:
//
//	"auto" or ""   real NVIDIA GPUs when the CUDA driver is usable, else the
//	               simulator (sim.DefaultSpec), with a one-line notice saying why
//	"cuda"         real GPUs; an error saying why when the driver is not usable
//	"sim", "sim:SPEC"  simulated GPUs (see backend/sim)
//	"cpu"          no GPU
//
// notice is a message for stderr (one line per notice), or "": why "auto"
// fell back to the simulator, and sim.HostBackingWarning when simulated
// devices with data could need more host memory than the machine has. Real GPUs are
// *cuda.Device values, numbered by CUDA ordinal (CUDA_VISIBLE_DEVICES
// applies), each with its NVML view attached by UUID when NVML is usable.
func OpenDevices(spec string) (gpus []backend.Device, notice string, err error) {
	return OpenDevicesWith(spec, DeviceOptions{})
}

// shortReason is the first clause of why the CUDA backend is unusable,
// for the one-line notice ("CUDA driver unavailable: libcuda.so.1 not
// found"); --device cuda reports the whole error.
func shortReason(err error) string {
	s := err.Error()
	if i := strings.Index(s, "; "); i > 0 {
		s = s[:i]
	}
	return strings.Replace(s, ": cannot open shared object file: No such file or directory", " not found", 1)
}

// OpenDevicesWith is OpenDevices with explicit libraries.
func OpenDevicesWith(spec string, o DeviceOptions) (gpus []backend.Device, notice string, err error) {
	switch {
	case spec == "" || spec == "auto":
		gpus, err := openCUDA(o)
		if err == nil {
			return gpus, "", nil
		}
		sp, _ := sim.ParseSpec(sim.DefaultSpec)
		notice := fmt.Sprintf("memsh: no usable NVIDIA GPU (%s); using the simulator (--device sim:%s)", shortReason(err), sp)
		if w := sim.HostBackingWarning(sp); w != "" {
			notice += "\nmemsh: " + w
		}
		return simDevices(sp), notice, nil
	case spec == "cpu":
		return nil, "", nil
	case spec == "sim" || strings.HasPrefix(spec, "sim:"):
		sp, err := sim.ParseSpec(strings.TrimPrefix(strings.TrimPrefix(spec, "sim"), ":"))
		if err != nil {
			return nil, "", fmt.Errorf("--device: %v", err)
		}
		// A data device larger than host RAM: say so before it fails.
		if w := sim.HostBackingWarning(sp); w != "" {
			return simDevices(sp), "memsh: " + w, nil
		}
		return simDevices(sp), "", nil
	case spec == "cuda":
		gpus, err := openCUDA(o)
		if err != nil {
			return nil, "", fmt.Errorf("--device cuda: %v", err)
		}
		return gpus, "", nil
	}
	return nil, "", fmt.Errorf("--device: unknown device %q (want auto, cuda, sim[:SPEC] or cpu)", spec)
}

// openCUDA opens the driver's devices and attaches their NVML views.
func openCUDA(o DeviceOptions) ([]backend.Device, error) {
	drv, err := cuda.Open(o.CUDALibrary)
	if err != nil {
		return nil, err
	}
	g := o.NVML
	if g == nil {
		g = nvml.Default()
	}
	var out []backend.Device
	for _, d := range drv.Devices() {
		var view *nvml.Device
		if g.Available() {
			if v, err := g.ByUUID(d.UUID()); err == nil {
				view = v
			}
		}
		d.SetNVML(view) // devices are shared by the process: replace any earlier view
		out = append(out, d)
	}
	return out, nil
}

func simDevices(sp sim.Spec) []backend.Device {
	ds := sim.New(sp)
	out := make([]backend.Device, len(ds))
	for i, d := range ds {
		out[i] = d
	}
	return out
}

// DeviceTable formats the devices as `memsh devices` prints them: index,
// device string, name, UUID, total, free and used memory, and the backend
// serving each, then the GPUs NVML sees that CUDA does not serve (hidden by
// CUDA_VISIBLE_DEVICES, or the parents of MIG devices), then host RAM.
// Figures of real GPUs come from NVML when it is usable (creating no CUDA
// context), else from cuMemGetInfo (which creates the context).
func DeviceTable(gpus []backend.Device) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "INDEX\tDEVICE\tNAME\tUUID\tTOTAL\tFREE\tUSED\tBACKEND\n")
	served := map[string]bool{}
	var gate *nvml.Gate
	for i, d := range gpus {
		uuid, backendName := "-", d.Kind()
		var total, free uint64
		var err error
		if c, ok := d.(*cuda.Device); ok {
			uuid = c.UUID()
			served[nvml.NormalizeUUID(uuid)] = true
			backendName = "cuda " + c.Driver().VersionString()
			if v := c.NVML(); v != nil {
				gate = v.Gate()
				backendName += ", NVML"
				var m nvml.Memory
				if m, err = v.Memory(); err == nil {
					total, free = m.Total, m.Free
				}
			} else {
				free, total, err = d.MemGetInfo()
			}
		} else {
			free, total, err = d.MemGetInfo()
		}
		if err != nil {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t?\t?\t?\t%s (%v)\n", i, d.Name(), d.Description(), uuid, backendName, err)
			continue
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", i, d.Name(), d.Description(), uuid,
			fmtSize(total), fmtSize(free), fmtSize(total-free), backendName)
	}
	if gate != nil {
		unservedRows(tw, gate, served)
	}
	total, avail := host.Total(), host.Available()
	fmt.Fprintf(tw, "-\tcpu\thost RAM\t-\t%s\t%s\t%s\thost\n", fmtSize(total), fmtSize(avail), fmtSize(total-avail))
	tw.Flush()
	return b.String()
}

func fmtSize(n uint64) string { return backend.FormatBytes(int64(n)) }

// unservedRows lists the GPUs and MIG devices NVML sees that no CUDA
// device serves.
func unservedRows(tw *tabwriter.Writer, g *nvml.Gate, served map[string]bool) {
	all, err := g.Devices()
	if err != nil {
		return
	}
	why := "not visible to CUDA"
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		why = fmt.Sprintf("hidden by CUDA_VISIBLE_DEVICES=%s", v)
	}
	row := func(d *nvml.Device, reason string) {
		m, err := d.Memory()
		if err != nil {
			fmt.Fprintf(tw, "-\t-\t%s\t%s\t?\t?\t?\tnvml only (%s; %v)\n", d.Name, d.UUID, reason, err)
			return
		}
		fmt.Fprintf(tw, "-\t-\t%s\t%s\t%s\t%s\t%s\tnvml only (%s)\n", d.Name, d.UUID, fmtSize(m.Total), fmtSize(m.Free), fmtSize(m.Total-m.Free), reason)
	}
	for _, d := range all {
		migs, _ := d.MIGDevices()
		if !served[nvml.NormalizeUUID(d.UUID)] {
			if len(migs) > 0 {
				row(d, "in MIG mode: CUDA serves its MIG devices")
			} else {
				row(d, why)
			}
		}
		for _, m := range migs {
			if !served[nvml.NormalizeUUID(m.UUID)] {
				row(m, why)
			}
		}
	}
}

// PresetTable formats the simulator's GPU presets as `memsh devices
// --presets` prints them: the spec word, the device name, the total memory
// (IEC units and bytes), the default context size and where the total was
// published.
func PresetTable() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "PRESET\tNAME\tTOTAL\tBYTES\tCONTEXT\tSOURCE\n")
	for _, p := range sim.Presets() {
		fmt.Fprintf(tw, "sim:%s\t%s\t%s\t%d\t%s\t%s; context: %s\n", p.Key, p.Name, fmtSize(p.Total), p.Total,
			fmtSize(p.Ctx), p.Source, p.CtxSource)
	}
	tw.Flush()
	return b.String()
}
