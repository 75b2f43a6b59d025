package cuda

import (
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
	stensor "github.com/memsh/memsh/starlib/tensor"
)

// The stream functions of the cuda module (torch.cuda's names; the
// caching allocator's semantics are backend.Stream's):
//
//	Stream(device=None)            a new stream of the device
//	current_stream(device=None)    the stream allocations are made on
//	default_stream(device=None)    the device's default stream
//	set_stream(stream)             make stream current on its device
//	stream(stream, fn, *args, **kwargs)  fn(*args, **kwargs) with stream current (torch.cuda.stream's with-block), then the previous one again
//
// A Stream has .device, .stream_id, .synchronize() (its work so far is
// done: blocks freed after record_stream on it become reusable) and
// .wait_stream(other) (device-side ordering: no memory effect).
// Tensor.record_stream(stream) notes that stream uses the tensor's memory.
func init() {
	for name, fn := range map[string]builtinFn{
		"Stream": newStream, "current_stream": currentStream, "default_stream": defaultStream,
		"set_stream": setStream, "stream": withStream,
	} {
		Module.Members[name] = starlark.NewBuiltin("cuda."+name, fn)
	}
	stensor.RegisterMethod("record_stream", recordStream)
}

// Stream is a CUDA stream of one device (type "cuda.Stream").
type Stream struct {
	device string // "cuda:N"
	id     backend.Stream
}

var (
	_ starlark.HasAttrs   = (*Stream)(nil)
	_ starlark.Comparable = (*Stream)(nil)
)

func (s *Stream) String() string {
	return fmt.Sprintf("<cuda.Stream device=%s stream_id=%d>", s.device, s.id)
}
func (s *Stream) Type() string          { return "cuda.Stream" }
func (s *Stream) Freeze()               {}
func (s *Stream) Truth() starlark.Bool  { return true }
func (s *Stream) Hash() (uint32, error) { return starlark.String(s.String()).Hash() }
func (s *Stream) AttrNames() []string {
	return []string{"device", "stream_id", "synchronize", "wait_stream"}
}

// CompareSameType: streams are equal when they are the same stream.
func (s *Stream) CompareSameType(op syntax.Token, y starlark.Value, depth int) (bool, error) {
	o := y.(*Stream)
	eq := s.device == o.device && s.id == o.id
	switch op {
	case syntax.EQL:
		return eq, nil
	case syntax.NEQ:
		return !eq, nil
	}
	return false, fmt.Errorf("%s %s %s not implemented", s.Type(), op, o.Type())
}

func (s *Stream) Attr(name string) (starlark.Value, error) {
	switch name {
	case "device":
		return starlark.String(s.device), nil
	case "stream_id":
		return starlark.MakeInt(int(s.id)), nil
	case "synchronize":
		return starlark.NewBuiltin("cuda.Stream.synchronize", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
				return nil, err
			}
			m, err := manager(thread, b)
			if err != nil {
				return nil, err
			}
			return starlark.None, m.Streams(s.device, func(a backend.StreamAllocator) error {
				a.SynchronizeStream(s.id)
				return nil
			})
		}).DeclarePure(), nil
	case "wait_stream":
		return starlark.NewBuiltin("cuda.Stream.wait_stream", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var o *Stream
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "stream", &o); err != nil {
				return nil, err
			}
			return starlark.None, nil
		}).DeclarePure(), nil
	}
	return nil, nil
}

// streamDevice resolves a device argument to its allocator's device name.
func streamDevice(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (*backend.Manager, string, error) {
	m, a, err := deviceArg(thread, b, args, kwargs)
	if err != nil {
		return nil, "", err
	}
	return m, a.Device().Name(), nil
}

func newStream(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	return streamFrom(thread, b, args, kwargs, backend.StreamAllocator.NewStream)
}

func currentStream(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	return streamFrom(thread, b, args, kwargs, backend.StreamAllocator.CurrentStream)
}

// streamFrom returns the stream pick gives of the device argument's
// allocator.
func streamFrom(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple, pick func(backend.StreamAllocator) backend.Stream) (starlark.Value, error) {
	m, dev, err := streamDevice(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	s := &Stream{device: dev}
	err = m.Streams(dev, func(a backend.StreamAllocator) error {
		s.id = pick(a)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return s, nil
}

func defaultStream(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	_, dev, err := streamDevice(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	return &Stream{device: dev}, nil
}

// set makes s current on its device and returns the previous stream.
func (s *Stream) set(m *backend.Manager, fname string) (backend.Stream, error) {
	var prev backend.Stream
	err := m.Streams(s.device, func(a backend.StreamAllocator) error {
		var err error
		prev, err = a.SetCurrentStream(s.id)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", fname, err)
	}
	return prev, nil
}

func setStream(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var s *Stream
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "stream", &s); err != nil {
		return nil, err
	}
	m, err := manager(thread, b)
	if err != nil {
		return nil, err
	}
	_, err = s.set(m, b.Name())
	return starlark.None, err
}

func withStream(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if len(args) < 2 {
		return nil, fmt.Errorf("%s: want stream and fn, got %d arguments", b.Name(), len(args))
	}
	s, ok := args[0].(*Stream)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter stream: got %s, want cuda.Stream", b.Name(), args[0].Type())
	}
	fn, ok := args[1].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter fn: got %s, want callable", b.Name(), args[1].Type())
	}
	m, err := manager(thread, b)
	if err != nil {
		return nil, err
	}
	prev, err := s.set(m, b.Name())
	if err != nil {
		return nil, err
	}
	defer m.Streams(s.device, func(a backend.StreamAllocator) error {
		_, err := a.SetCurrentStream(prev)
		return err
	})
	thread.DeclareTransparent()
	return starlark.Call(thread, fn, args[2:], kwargs)
}

func recordStream(thread *starlark.Thread, fname string, t *stensor.Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var s *Stream
	if err := starlark.UnpackArgs(fname, args, kwargs, "stream", &s); err != nil {
		return nil, err
	}
	e := t.Engine()
	if e.Device() != s.device {
		return nil, fmt.Errorf("%s: the stream is on %s, the tensor on %s", fname, s.device, e.Device())
	}
	en, err := env.Of(thread, fname)
	if err != nil {
		return nil, err
	}
	m := en.Manager
	mem := e.Memory()
	if mem == nil {
		return starlark.None, nil
	}
	if err := m.RecordStream(mem, s.id); err != nil {
		return nil, fmt.Errorf("%s: %w", fname, err)
	}
	return starlark.None, nil
}
