package nvml

import (
	"fmt"
	"reflect"
)

// asLibrary returns lib as a Library: itself when it is one, else an
// adapter over a value with go-nvml's nvml.Interface method set (go-nvml's
// mock and mock/dgxa100 servers). The adapter calls lib's methods by name
// through reflection and copies results field by field, so this package
// does not import go-nvml, whose cgo package would put NVML's C header
// (and its deprecation warnings) into every build of memsh; only tests
// that use go-nvml's mocks compile it.
func asLibrary(lib any) (Library, error) {
	if l, ok := lib.(Library); ok {
		return l, nil
	}
	v := reflect.ValueOf(lib)
	for _, m := range []string{"Init", "Shutdown", "Extensions", "DeviceGetCount", "DeviceGetHandleByIndex", "SystemGetDriverVersion", "SystemGetProcessName"} {
		if !v.MethodByName(m).IsValid() {
			return nil, fmt.Errorf("%T is neither an nvml.Library nor go-nvml's nvml.Interface (no %s)", lib, m)
		}
	}
	return reflLib{v}, nil
}

// call calls v's method name and splits off the trailing Return.
func call(v reflect.Value, name string, args ...any) ([]reflect.Value, Return) {
	in := make([]reflect.Value, len(args))
	m := v.MethodByName(name)
	for i, a := range args {
		in[i] = reflect.ValueOf(a).Convert(m.Type().In(i))
	}
	out := m.Call(in)
	last := out[len(out)-1]
	return out[:len(out)-1], Return(last.Int())
}

// copyFields sets each field of *dst from src's field of the same name.
func copyFields(dst any, src reflect.Value) {
	d := reflect.ValueOf(dst).Elem()
	for i := range d.NumField() {
		f := d.Type().Field(i)
		if s := src.FieldByName(f.Name); s.IsValid() {
			d.Field(i).Set(s.Convert(f.Type))
		}
	}
}

type reflLib struct{ v reflect.Value }

func (l reflLib) Init() Return     { _, r := call(l.v, "Init"); return r }
func (l reflLib) Shutdown() Return { _, r := call(l.v, "Shutdown"); return r }

func (l reflLib) LookupSymbol(sym string) error {
	ext := l.v.MethodByName("Extensions").Call(nil)[0]
	if err := ext.MethodByName("LookupSymbol").Call([]reflect.Value{reflect.ValueOf(sym)})[0]; !err.IsNil() {
		return err.Interface().(error)
	}
	return nil
}

func (l reflLib) SystemGetDriverVersion() (string, Return) {
	out, r := call(l.v, "SystemGetDriverVersion")
	return out[0].String(), r
}

func (l reflLib) SystemGetProcessName(pid int) (string, Return) {
	out, r := call(l.v, "SystemGetProcessName", pid)
	return out[0].String(), r
}

func (l reflLib) DeviceGetCount() (int, Return) {
	out, r := call(l.v, "DeviceGetCount")
	return int(out[0].Int()), r
}

func (l reflLib) DeviceGetHandleByIndex(i int) (Handle, Return) {
	out, r := call(l.v, "DeviceGetHandleByIndex", i)
	return reflHandleOf(out[0]), r
}

// reflHandleOf wraps a go-nvml Device value, nil for a nil one.
func reflHandleOf(v reflect.Value) Handle {
	if v.Kind() == reflect.Interface {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	return reflHandle{v}
}

type reflHandle struct{ v reflect.Value }

func (h reflHandle) GetUUID() (string, Return) {
	out, r := call(h.v, "GetUUID")
	return out[0].String(), r
}

func (h reflHandle) GetName() (string, Return) {
	out, r := call(h.v, "GetName")
	return out[0].String(), r
}

func (h reflHandle) GetMemoryInfo() (m MemoryV1, r Return) {
	out, r := call(h.v, "GetMemoryInfo")
	copyFields(&m, out[0])
	return m, r
}

func (h reflHandle) GetMemoryInfo_v2() (m MemoryV2, r Return) {
	out, r := call(h.v, "GetMemoryInfo_v2")
	copyFields(&m, out[0])
	return m, r
}

func (h reflHandle) GetComputeRunningProcesses() ([]ProcessInfo, Return) {
	out, r := call(h.v, "GetComputeRunningProcesses")
	ps := make([]ProcessInfo, out[0].Len())
	for i := range ps {
		copyFields(&ps[i], out[0].Index(i))
	}
	return ps, r
}

func (h reflHandle) GetUtilizationRates() (u Utilization, r Return) {
	out, r := call(h.v, "GetUtilizationRates")
	u.GPU = uint32(out[0].FieldByName("Gpu").Uint())
	u.Memory = uint32(out[0].FieldByName("Memory").Uint())
	return u, r
}

func (h reflHandle) GetMigMode() (int, int, Return) {
	out, r := call(h.v, "GetMigMode")
	return int(out[0].Int()), int(out[1].Int()), r
}

func (h reflHandle) GetMaxMigDeviceCount() (int, Return) {
	out, r := call(h.v, "GetMaxMigDeviceCount")
	return int(out[0].Int()), r
}

func (h reflHandle) GetMigDeviceHandleByIndex(i int) (Handle, Return) {
	out, r := call(h.v, "GetMigDeviceHandleByIndex", i)
	return reflHandleOf(out[0]), r
}
