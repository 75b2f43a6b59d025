package nvml_test

import (
	"flag"
	"testing"

	"github.com/memsh/memsh/backend/nvml"
)

// realNVML makes the benchmarks query the system's NVML instead of the mock:
//
//	go test ./backend/nvml -run XXX -bench . -nvml
var realNVML = flag.Bool("nvml", false, "benchmark the system's NVML instead of go-nvml's mock")

func benchDevice(b *testing.B) *nvml.Device {
	g := nvml.New(server(nil))
	if *realNVML {
		g = nvml.Default()
	}
	if !g.Available() {
		b.Skip(g.Err())
	}
	d, err := g.Device(0)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkMemory is one device memory query through the gate (the v2
// query where the library has it).
func BenchmarkMemory(b *testing.B) {
	d := benchDevice(b)
	for range b.N {
		if _, err := d.Memory(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProcesses is one per-process query (with process names).
func BenchmarkProcesses(b *testing.B) {
	d := benchDevice(b)
	for range b.N {
		if _, err := d.Processes(); err != nil {
			b.Fatal(err)
		}
	}
}
