package scope

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
)

// OpenDevices opens the GPU devices a --device value selects: "auto" or ""
// (real GPUs when usable; until the cuda backend exists, the simulator with
// a notice), "sim" or "sim:SPEC" (backend/sim), or "cpu" (no GPU). notice is
// a one-line message for stderr, or "".
func OpenDevices(spec string) (gpus []backend.Device, notice string, err error) {
	switch {
	case spec == "" || spec == "auto":
		sp, _ := sim.ParseSpec(sim.DefaultSpec)
		return simDevices(sp), fmt.Sprintf("memsh: no usable NVIDIA GPU backend; using the simulator (--device sim:%s)", sp), nil
	case spec == "cpu":
		return nil, "", nil
	case spec == "sim" || strings.HasPrefix(spec, "sim:"):
		sp, err := sim.ParseSpec(strings.TrimPrefix(strings.TrimPrefix(spec, "sim"), ":"))
		if err != nil {
			return nil, "", fmt.Errorf("--device: %v", err)
		}
		return simDevices(sp), "", nil
	case spec == "cuda":
		return nil, "", fmt.Errorf("--device cuda: the CUDA backend is not available in this build")
	}
	return nil, "", fmt.Errorf("--device: unknown device %q (want auto, cuda, sim[:SPEC] or cpu)", spec)
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
// device string, description, total, free and used memory, and backend,
// followed by host RAM.
func DeviceTable(gpus []backend.Device) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "INDEX\tDEVICE\tNAME\tTOTAL\tFREE\tUSED\tBACKEND\n")
	for i, d := range gpus {
		free, total, err := d.MemGetInfo()
		if err != nil {
			fmt.Fprintf(tw, "%d\t%s\t%s\t?\t?\t?\t%s (%v)\n", i, d.Name(), d.Description(), d.Kind(), err)
			continue
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", i, d.Name(), d.Description(),
			backend.FormatBytes(int64(total)), backend.FormatBytes(int64(free)), backend.FormatBytes(int64(total-free)), d.Kind())
	}
	total, avail := host.Total(), host.Available()
	fmt.Fprintf(tw, "-\tcpu\thost RAM\t%s\t%s\t%s\thost\n", backend.FormatBytes(int64(total)), backend.FormatBytes(int64(avail)), backend.FormatBytes(int64(total-avail)))
	tw.Flush()
	return b.String()
}
