package tensor

import (
	"fmt"
	"sort"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Softmax as Tensor methods and tensor module functions (differentiable:
// SoftmaxBackward0 / LogSoftmaxBackward0 save the result):
//
//	softmax(dim, dtype=None) log_softmax(dim, dtype=None)   a new tensor of the input's shape
//	tensor.softmax(input, dim, dtype=None) tensor.log_softmax(input, dim, dtype=None)
//
// With dtype the input is converted first (as torch.softmax(x, dim, dtype)).
func init() {
	for name, log := range map[string]bool{"softmax": false, "log_softmax": true} {
		methods[name] = softmaxMethod(log)
		attrNames = append(attrNames, name)
		Module.Members[name] = starlark.NewBuiltin("tensor."+name, methodAsFunction(name))
	}
	sort.Strings(attrNames)
}

func softmaxMethod(log bool) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var dimV starlark.Value
		var dtV starlark.Value = starlark.None
		if err := starlark.UnpackArgs(fname, args, kwargs, "dim", &dimV, "dtype?", &dtV); err != nil {
			return nil, err
		}
		var dim int
		if err := starlark.AsInt(dimV, &dim); err != nil {
			return nil, fmt.Errorf("%s: for parameter dim: got %s, want int", fname, dimV.Type())
		}
		dt := tensor.Undefined
		if dtV != starlark.None {
			d, err := dtypeArg(fname, dtV, tensor.Undefined)
			if err != nil {
				return nil, err
			}
			dt = d
		}
		return resultAs(fname)(autograd.SoftmaxDType(t.t, dim, dt, log))
	}
}
