package tensor_test

import (
	"testing"

	"github.com/memsh/memsh/backend/sim"
)

// TestErrorsMore: bad input to the newer ops and the overflow guards gives
// an error naming the builtin and operands, and (checked by wantErr)
// leaves nothing allocated after a reclaim.
func TestErrorsMore(t *testing.T) {
	f := newFixture(t, sim.Spec{})
	f.run(`
a = tensor.ones(2, 3, device="cuda")
o = tensor.empty(2, 3, device="cuda")
i = tensor.zeros(2, 3, dtype="int32", device="cuda")
h = tensor.ones(2, 3)
`)
	for _, c := range []struct{ src, want string }{
		// out=
		{`tensor.add(a, a, out=tensor.empty(3, 2, device="cuda"))`, `tensor.add: for parameter out: shape [3, 2] does not match the result's shape [2, 3]`},
		{`tensor.add(a, a, out=h)`, `tensor.add: for parameter out: expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu`},
		{`tensor.add(a, 0.5, out=i)`, `tensor.add: for parameter out: result type float32 can't be cast to the desired output type int32`},
		{`tensor.div(i, 2, out=i)`, `tensor.div: for parameter out: result type float32 can't be cast to the desired output type int32`},
		{`tensor.add(a, a, out=tensor.empty(3, device="cuda").expand(2, 3))`, `tensor.add: unsupported operation: more than one element of the written-to tensor refers to a single memory location`},
		{`tensor.add(a.narrow(1, 1, 2), a.narrow(1, 0, 2), out=a.narrow(1, 0, 2))`, `tensor.add: unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location`},
		{`tensor.add(a, a, out=3)`, `tensor.add: for parameter "out": got int, want tensor`},
		{`tensor.matmul(a, a.t(), out=tensor.empty(3, 3, device="cuda"))`, `tensor.matmul: for parameter out: shape [3, 3] does not match the result's shape [2, 2]`},
		{`tensor.matmul(a, a.t(), out=tensor.empty(2, 2, device="cuda").t())`, `tensor.matmul: for parameter out: want a contiguous float32 tensor, got a non-contiguous float32 one`},
		{`tensor.matmul(a, a.t(), out=tensor.empty(2, 2, dtype="float64", device="cuda"))`, `tensor.matmul: for parameter out: want a contiguous float32 tensor, got a contiguous float64 one`},
		{`tensor.matmul(a.narrow(1, 0, 2), a.narrow(1, 0, 2), out=a.narrow(1, 1, 2))`, `tensor.matmul: unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location`},
		// shapes whose byte count overflows, and other overflows
		{`tensor.ones(1).expand(1 << 40, 1 << 40)`, `tensor.expand: shape [1099511627776, 1099511627776] needs more than 2^62 bytes`},
		{`tensor.zeros(1 << 31, 1 << 31, 4)`, `tensor.zeros: shape [2147483648, 2147483648, 4] needs more than 2^62 bytes`},
		{`tensor.empty([1 << 62], dtype="int16")`, `tensor.empty: shape [4611686018427387904] needs more than 2^62 bytes`},
		{`tensor.ones(1 << 63)`, `tensor.ones: shape [9223372036854775808] needs more than 2^62 bytes`},
		{`tensor.arange(0, 1e30)`, `tensor.arange: shape [1000000000000000019884624838656] needs more than 2^62 bytes`},
		{`tensor.arange(-(1 << 62), 1 << 62)`, `tensor.arange: shape [9223372036854775808] needs more than 2^62 bytes`},
		{`tensor.arange(0, float("inf"))`, `tensor.arange: unsupported range: 0 -> +inf`},
		{`tensor.ones(6).view(1 << 40, 1 << 40, -1)`, `tensor.view: shape '[1099511627776, 1099511627776, -1]' is invalid for input of size 6`},
		{`tensor.ones(6).reshape(1 << 40, 1 << 40, 0, 2)`, `tensor.reshape: shape '[1099511627776, 1099511627776, 0, 2]' is invalid for input of size 6`},
		{`tensor.cat([tensor.ones(1, dtype="uint8").expand(1 << 61)] * 3)`, `tensor.cat: the result's dimension 0 has more than 2^62 elements`},
		{`tensor.ones(1, dtype="uint8").expand(1 << 61, 3)`, `tensor.expand: shape [2305843009213693952, 3] needs more than 2^62 bytes`},
		// incompatible dtypes
		{`tensor.matmul(tensor.ones(2, 2, dtype="int64"), tensor.ones(2, 2))`, `tensor.matmul: expected both tensors to have the same dtype, but got: int64 != float32`},
		{`i.add_(a)`, `tensor.add_: result type float32 can't be cast to the desired output type int32`},
		{`i.div_(2)`, `tensor.div_: result type float32 can't be cast to the desired output type int32`},
		{`tensor.ones(2, dtype="bool").mul_(2)`, `tensor.mul_: result type int64 can't be cast to the desired output type bool`},
		{`tensor.ones(2, dtype="bool").sub(tensor.ones(2))`, `tensor.sub: subtraction, the`},
		{`tensor.matmul(tensor.ones(2, 2, dtype="bool"), tensor.ones(2, 2, dtype="bool"))`, `tensor.matmul: not implemented for 'bool'`},
		{`tensor.arange(3, dtype="bool")`, `tensor.arange: for parameter dtype: arange does not support bool`},
		{`tensor.randn(3, dtype="int8")`, `tensor.randn: for parameter dtype: want a floating-point dtype, got int8`},
		{`tensor.ones(2).to(dtype="complex64")`, `tensor.to: unknown dtype "complex64"`},
		{`tensor.ones(2).to(3)`, `tensor.to: got int, want device string, dtype or tensor`},
		// shape mismatches
		{`a + tensor.ones(4, device="cuda")`, `tensor.add: the size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1`},
		{`a.lt(tensor.ones(2, device="cuda"))`, `tensor.lt: the size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 1`},
		{`a.allclose(tensor.ones(4, device="cuda"))`, `tensor.allclose: the size of tensor a (3) must match the size of tensor b (4)`},
		{`tensor.matmul(tensor.ones(3), tensor.ones(4))`, `tensor.matmul: inconsistent tensor size, expected tensor [3] and src [4] to have the same number of elements`},
		{`tensor.matmul(tensor.ones(2, 2, 3), tensor.ones(2, 4, 5))`, `tensor.matmul: size mismatch: [2, 2, 3] @ [2, 4, 5] (contracted dimensions 3 and 4)`},
		{`tensor.matmul(tensor.ones(3, 2, 3), tensor.ones(2, 3, 5))`, `tensor.matmul: the size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 0`},
		{`tensor.matmul(tensor.tensor(1.0), tensor.ones(2))`, `tensor.matmul: both arguments to matmul need to be at least 1D, but they are 0D and 1D`},
		{`tensor.cat([tensor.ones(2, 2), tensor.ones(2)])`, `tensor.cat: tensors must have same number of dimensions: got 2 and 1`},
		{`tensor.cat([tensor.tensor(1), tensor.tensor(2)])`, `tensor.cat: zero-dimensional tensor (at position 0) cannot be concatenated`},
		{`tensor.cat([a, h])`, `tensor.cat: expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu`},
		{`tensor.cat([a, 1])`, `tensor.cat: for parameter tensors: element 1: got int, want tensor`},
		{`tensor.stack([a, a], dim=3)`, `tensor.stack: dimension out of range (expected to be in range of [-3, 2], but got 3)`},
		{`a.copy_(tensor.ones(3, 2))`, `tensor.copy_: the size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 1`},
		{`a.expand(4, 3)`, `tensor.expand: the expanded size of the tensor (4) must match the existing size (2) at non-singleton dimension 0`},
		{`a.permute(0)`, `tensor.permute: number of dims don't match in permute (tensor has 2, got 1)`},
		{`a.unsqueeze(3)`, `tensor.unsqueeze: dimension out of range (expected to be in range of [-3, 2], but got 3)`},
		{`a.flatten(1, 0)`, `tensor.flatten: start_dim cannot come after end_dim`},
		{`a.view("x")`, `tensor.view: for parameter shape: got string, want list or tuple`},
		{`a.size(2)`, `tensor.size: dimension out of range (expected to be in range of [-2, 1], but got 2)`},
		// indexing
		{`a[2]`, `tensor index: index 2 is out of bounds for dimension 0 with size 2`},
		{`a[0, -4]`, `tensor index: index -4 is out of bounds for dimension 1 with size 3`},
		{`a[1 << 70]`, `tensor index: index 1180591620717411303424 is out of bounds for dimension 0 with size 2`},
		{`a[0.5]`, `tensor index: got float, want int, None or tensor`},
		{`tensor.tensor(3)[0]`, `tensor index: invalid index of a 0-dim tensor`},
		{`a.select(0, 2)`, `tensor.select: index 2 out of range for tensor of size [2, 3] at dimension 0`},
		{`a.narrow(1, 2, 2)`, `tensor.narrow: start (2) + length (2) exceeds dimension size (3)`},
		// module-function arguments
		{`tensor.add()`, `tensor.add: missing argument for input`},
		{`tensor.add(3, a)`, `tensor.add: for parameter input: got int, want tensor`},
		{`tensor.sum(a, dim="x")`, `tensor.sum: for parameter dim: got string, want int, tuple of ints or None`},
		{`tensor.full(3, 1)`, `tensor.full: for parameter shape: got int, want list or tuple`},
		{`tensor.zeros_like([1])`, `tensor.zeros_like: for parameter input: got list, want tensor`},
		{`tensor.manual_seed(1 << 70)`, `tensor.manual_seed: for parameter seed: 1180591620717411303424 does not fit in 64 bits`},
		{`a.item()`, `tensor.item: a tensor with 6 elements cannot be converted to a number`},
	} {
		f.wantErr(c.src, c.want)
	}
	// The session is still usable, and the operands are unchanged.
	f.run(`
assert.eq(a.tolist(), [[1, 1, 1], [1, 1, 1]])
assert.eq(i.tolist(), [[0, 0, 0], [0, 0, 0]])
assert.eq((a + 1).sum().item(), 12.0)
`)
}
