package dist

import (
	"fmt"
	"strings"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/env"
	tdist "github.com/memsh/memsh/tensor/dist"
)

// Mesh is a DeviceMesh (torch.distributed.device_mesh): the ranks of the
// job laid out row-major in shape, this Session's rank at its coordinate.
// A 1-D mesh is one process group (Group); indexing a mesh by a dim's
// name gives that dim's 1-D mesh (the ranks that share this rank's other
// coordinates).
type Mesh struct {
	shape []int
	names []string // mesh_dim_names (nil: none)
	rank  int      // this rank in the whole mesh
}

var (
	_ starlark.Value    = (*Mesh)(nil)
	_ starlark.HasAttrs = (*Mesh)(nil)
	_ starlark.Mapping  = (*Mesh)(nil)
	_ env.Reacher       = (*Mesh)(nil)
)

func (m *Mesh) String() string {
	var b strings.Builder
	b.WriteString("DeviceMesh('cuda', ")
	b.WriteString(fmt.Sprint(m.shape))
	if m.names != nil {
		fmt.Fprintf(&b, ", mesh_dim_names=%q", m.names)
	}
	b.WriteString(")")
	return b.String()
}
func (m *Mesh) Type() string          { return "DeviceMesh" }
func (m *Mesh) Freeze()               {}
func (m *Mesh) Truth() starlark.Bool  { return true }
func (m *Mesh) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: DeviceMesh") }

// Reach: a mesh holds no memory.
func (m *Mesh) Reach(w *env.Walker) {}

// coord returns this rank's coordinate on mesh dim d.
func (m *Mesh) coord(d int) int {
	r := m.rank
	for i := len(m.shape) - 1; i > d; i-- {
		r /= m.shape[i]
	}
	return r % m.shape[d]
}

// Group returns the process group of a 1-D mesh (an error for more dims).
func (m *Mesh) Group(fname string) (*tdist.Group, error) {
	if len(m.shape) != 1 {
		return nil, fmt.Errorf("%s: a %d-D DeviceMesh: give its 1-D mesh (mesh[\"name\"])", fname, len(m.shape))
	}
	return tdist.New(m.shape[0], m.coord(0), "nccl")
}

func (m *Mesh) Attr(name string) (starlark.Value, error) {
	switch name {
	case "ndim":
		return starlark.MakeInt(len(m.shape)), nil
	case "shape":
		t := make(starlark.Tuple, len(m.shape))
		for i, n := range m.shape {
			t[i] = starlark.MakeInt(n)
		}
		return t, nil
	case "mesh_dim_names":
		if m.names == nil {
			return starlark.None, nil
		}
		t := make(starlark.Tuple, len(m.names))
		for i, n := range m.names {
			t[i] = starlark.String(n)
		}
		return t, nil
	case "size":
		return starlark.NewBuiltin("DeviceMesh.size", m.size), nil
	case "get_local_rank":
		return starlark.NewBuiltin("DeviceMesh.get_local_rank", m.localRank), nil
	}
	return nil, nil
}

func (m *Mesh) AttrNames() []string {
	return []string{"get_local_rank", "mesh_dim_names", "ndim", "shape", "size"}
}

func (m *Mesh) dimArg(b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (int, bool, error) {
	var d starlark.Value = starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "mesh_dim?", &d); err != nil {
		return 0, false, err
	}
	if d == starlark.None {
		return 0, false, nil
	}
	i, err := m.dimIndex(b.Name(), d)
	return i, true, err
}

func (m *Mesh) dimIndex(fname string, d starlark.Value) (int, error) {
	if s, ok := starlark.AsString(d); ok {
		for i, n := range m.names {
			if n == s {
				return i, nil
			}
		}
		return 0, fmt.Errorf("%s: mesh dimension %q does not exist (mesh_dim_names: %q)", fname, s, m.names)
	}
	var i int
	if err := starlark.AsInt(d, &i); err != nil || i < 0 || i >= len(m.shape) {
		return 0, fmt.Errorf("%s: mesh_dim %s is out of range for a %d-D mesh", fname, d, len(m.shape))
	}
	return i, nil
}

func (m *Mesh) size(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	d, ok, err := m.dimArg(b, args, kwargs)
	if err != nil {
		return nil, err
	}
	if ok {
		return starlark.MakeInt(m.shape[d]), nil
	}
	n := 1
	for _, s := range m.shape {
		n *= s
	}
	return starlark.MakeInt(n), nil
}

func (m *Mesh) localRank(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	d, ok, err := m.dimArg(b, args, kwargs)
	if err != nil {
		return nil, err
	}
	if !ok && len(m.shape) != 1 {
		return nil, fmt.Errorf("%s: optional kwarg `mesh_dim` needs to be specified when device_mesh.ndim > 1", b.Name())
	}
	return starlark.MakeInt(m.coord(d)), nil
}

// Get is mesh["name"]: the 1-D mesh of that dim through this rank.
func (m *Mesh) Get(k starlark.Value) (starlark.Value, bool, error) {
	d, err := m.dimIndex("DeviceMesh", k)
	if err != nil {
		return nil, false, err
	}
	if len(m.shape) == 1 {
		return m, true, nil
	}
	var names []string
	if m.names != nil {
		names = []string{m.names[d]}
	}
	return &Mesh{shape: []int{m.shape[d]}, names: names, rank: m.coord(d)}, true, nil
}

// initDeviceMesh is init_device_mesh(device_type, mesh_shape,
// mesh_dim_names=None): the default process group is initialized with
// the mesh's size when there is none, and must have that size when
// there is one.
func initDeviceMesh(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var dev string
	var shapeV starlark.Value
	var namesV starlark.Value = starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "device_type", &dev, "mesh_shape", &shapeV, "mesh_dim_names?", &namesV); err != nil {
		return nil, err
	}
	if dev != "cuda" {
		return nil, fmt.Errorf("%s: device_type: memsh's process groups are NCCL's, on \"cuda\" (got %q)", b.Name(), dev)
	}
	it, ok := shapeV.(starlark.Iterable)
	if !ok {
		return nil, fmt.Errorf("%s: mesh_shape: got %s, want a tuple of ints", b.Name(), shapeV.Type())
	}
	var shape []int
	n := 1
	for x := range starlark.Elements(it) {
		var k int
		if err := starlark.AsInt(x, &k); err != nil || k < 1 {
			return nil, fmt.Errorf("%s: mesh_shape: %s is not a positive int", b.Name(), x)
		}
		shape = append(shape, k)
		n *= k
	}
	if len(shape) == 0 {
		return nil, fmt.Errorf("%s: mesh_shape is empty", b.Name())
	}
	var names []string
	if namesV != starlark.None {
		it, ok := namesV.(starlark.Iterable)
		if !ok {
			return nil, fmt.Errorf("%s: mesh_dim_names: got %s, want a tuple of strings", b.Name(), namesV.Type())
		}
		for x := range starlark.Elements(it) {
			s, ok := starlark.AsString(x)
			if !ok {
				return nil, fmt.Errorf("%s: mesh_dim_names: %s is not a string", b.Name(), x)
			}
			names = append(names, s)
		}
		if len(names) != len(shape) {
			return nil, fmt.Errorf("%s: mesh_shape and mesh_dim_names should have same length! Found len(mesh_dim_names): %d and len(mesh_shape):%d.", b.Name(), len(names), len(shape))
		}
	}
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	g := Group(e)
	if g == nil {
		if g, err = tdist.New(n, 0, "nccl"); err != nil {
			return nil, fmt.Errorf("%s: %v", b.Name(), err)
		}
		e.Values[groupKey] = g
	} else if g.Size != n {
		return nil, fmt.Errorf("%s: mesh_shape %v has %d ranks but the process group has world_size %d", b.Name(), shape, n, g.Size)
	}
	return &Mesh{shape: shape, names: names, rank: g.Rank}, nil
}
