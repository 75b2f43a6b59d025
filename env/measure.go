// This file defines memsh's memory figures — used, consumed, peak,
// peaked, reclaimed, available — and the data of an experiment or trial, as
// docs/starlark.md defines them, with their Starlark and JSON forms.
package env

import (
	"time"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"
)

// Figures are one resource's memory figures over an interval, in bytes, as
// docs/starlark.md defines them.
type Figures struct {
	// Device is "host" for host RAM, or the GPU's device string ("cuda:0").
	Device string
	// Used at the end of the interval: host process RSS, or the GPU
	// allocator's allocated bytes (allocated_bytes.all.current). A
	// simulated GPU keeps its data in this process's memory; those resident
	// pages (mincore) are not counted in host RSS, so host figures are the
	// host's own, as with a real GPU.
	Used int64
	// Consumed is used at the end minus used at the start.
	Consumed int64
	// Peak is the exact maximum of used during the interval (host: VmHWM
	// where the kernel lets memsh reset it, otherwise sampled). With a
	// simulated GPU holding data, the host peak is VmHWM less the
	// simulator's resident pages at the end, a lower bound when the
	// simulator touched new pages during the interval.
	Peak int64
	// Peaked is the transient blip above what was kept, as ipyexperiments,
	// its CellLogger and fastai's GPUMemTrace define it:
	// max(0, peak − start) − max(0, consumed).
	Peaked int64
	// Reclaimed is how much of consumed came back at finish; 0 until then.
	Reclaimed int64
	// Available is free memory now: device free (cuMemGetInfo, or the
	// simulator's), or the host's MemAvailable.
	Available int64
}

// Data is what an experiment measured: docs/starlark.md's
// struct(name, time, host, gpu, gpus).
type Data struct {
	Name string
	Time time.Duration // elapsed wall time
	Host Figures
	GPU  *Figures // the current device's figures; nil without GPUs
	GPUs []Figures
}

// Value returns the data as the Starlark struct data() and finish() return:
// struct(name, time, host, gpu, gpus) with time in seconds and each figure
// struct(device, used, consumed, peak, peaked, reclaimed, available) in
// bytes; gpu is None without GPUs.
func (d *Data) Value() starlark.Value {
	gpus := make([]starlark.Value, len(d.GPUs))
	for i := range d.GPUs {
		gpus[i] = d.GPUs[i].Value()
	}
	var gpu starlark.Value = starlark.None
	if d.GPU != nil {
		gpu = d.GPU.Value()
	}
	return starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
		"name": starlark.String(d.Name),
		"time": starlark.Float(d.Time.Seconds()),
		"host": d.Host.Value(),
		"gpu":  gpu,
		"gpus": starlark.Tuple(gpus),
	})
}

// Value returns the figures as a Starlark struct(device, used, consumed,
// peak, peaked, reclaimed, available).
func (f *Figures) Value() starlark.Value {
	return starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
		"device":    starlark.String(f.Device),
		"used":      starlark.MakeInt64(f.Used),
		"consumed":  starlark.MakeInt64(f.Consumed),
		"peak":      starlark.MakeInt64(f.Peak),
		"peaked":    starlark.MakeInt64(f.Peaked),
		"reclaimed": starlark.MakeInt64(f.Reclaimed),
		"available": starlark.MakeInt64(f.Available),
	})
}
