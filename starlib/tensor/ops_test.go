package tensor_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend/sim"
)

// promoteTable is PyTorch's torch.promote_types for memsh's dtypes, written
// out from PyTorch's documented lookup table (c10/core/ScalarType.cpp):
// row and column order as in names.
var promoteTable = struct {
	names []string
	table [][]string
}{
	names: []string{"uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool", "bfloat16"},
	table: [][]string{
		//         u8          i8          i16         i32        i64        f16         f32        f64        bool        bf16
		/* u8  */ {"uint8", "int16", "int16", "int32", "int64", "float16", "float32", "float64", "uint8", "bfloat16"},
		/* i8  */ {"int16", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "int8", "bfloat16"},
		/* i16 */ {"int16", "int16", "int16", "int32", "int64", "float16", "float32", "float64", "int16", "bfloat16"},
		/* i32 */ {"int32", "int32", "int32", "int32", "int64", "float16", "float32", "float64", "int32", "bfloat16"},
		/* i64 */ {"int64", "int64", "int64", "int64", "int64", "float16", "float32", "float64", "int64", "bfloat16"},
		/* f16 */ {"float16", "float16", "float16", "float16", "float16", "float16", "float32", "float64", "float16", "float32"},
		/* f32 */ {"float32", "float32", "float32", "float32", "float32", "float32", "float32", "float64", "float32", "float32"},
		/* f64 */ {"float64", "float64", "float64", "float64", "float64", "float64", "float64", "float64", "float64", "float64"},
		/* b   */ {"uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool", "bfloat16"},
		/* bf16*/ {"bfloat16", "bfloat16", "bfloat16", "bfloat16", "bfloat16", "float32", "float32", "float64", "bfloat16", "bfloat16"},
	},
}

// TestPromotionTable checks the result dtype of a + b and a * b for every
// pair of dtypes, with both operands dimensioned tensors, against
// PyTorch's table; and that the result holds the right value.
func TestPromotionTable(t *testing.T) {
	f := newFixture(t, sim.Spec{})
	names := promoteTable.names
	for i, a := range names {
		for j, b := range names {
			want := promoteTable.table[i][j]
			src := fmt.Sprintf(`
x = tensor.ones(2, dtype=%q)
y = tensor.ones(2, dtype=%q)
s = x + y
p = x * y
assert.eq(str(s.dtype), %[3]q)
assert.eq(str(p.dtype), %[3]q)
assert.eq(p.tolist(), [True, True] if %[3]q == "bool" else [1, 1])
assert.eq(s.tolist(), [True, True] if %[3]q == "bool" else [2, 2])
`, a, b, want)
			if err := f.exec(src); err != nil {
				t.Errorf("%s op %s: %v", a, b, err)
			}
		}
	}
}

// TestResultType checks PyTorch's tiers: numbers and 0-dim tensors change
// the result dtype only when of a higher category (bool < int < float).
// Expected values follow torch.result_type's documented rules.
func TestResultType(t *testing.T) {
	f := newFixture(t, sim.Spec{})
	for _, c := range []struct{ expr, want string }{
		{`tensor.ones(2, dtype="int32") + 1`, "int32"},
		{`tensor.ones(2, dtype="int32") + 1.5`, "float32"},
		{`tensor.ones(2, dtype="int32") + True`, "int32"},
		{`tensor.ones(2, dtype="uint8") + 1000`, "uint8"},
		{`tensor.ones(2, dtype="bool") + 1`, "int64"},
		{`tensor.ones(2, dtype="bool") + 2.5`, "float32"},
		{`tensor.ones(2, dtype="bool") + True`, "bool"},
		{`tensor.ones(2, dtype="float16") + 1.5`, "float16"},
		{`tensor.ones(2, dtype="bfloat16") * 3`, "bfloat16"},
		{`tensor.ones(2, dtype="float64") + 1.5`, "float64"},
		{`tensor.ones(2, dtype="int32") + tensor.tensor(1)`, "int32"},                      // 0-dim int64: same category
		{`tensor.ones(2, dtype="int32") + tensor.tensor(1.0, dtype="float64")`, "float64"}, // 0-dim of a higher category
		{`tensor.ones(2, dtype="float16") + tensor.tensor(1.0, dtype="float64")`, "float16"},
		{`tensor.ones(2, dtype="uint8") + tensor.tensor(1, dtype="int8")`, "uint8"},
		{`tensor.tensor(1, dtype="int8") + tensor.tensor(1, dtype="uint8")`, "int16"}, // both 0-dim
		{`tensor.tensor(1, dtype="int32") + 2.5`, "float32"},
		{`tensor.ones(2, dtype="int64") / 2`, "float32"}, // true division
		{`tensor.ones(2, dtype="float16") / tensor.ones(2)`, "float32"},
		{`tensor.ones(2, dtype="int8") // 2`, "int8"},
		{`tensor.ones(2, dtype="bool").eq(1.5)`, "bool"},
		{`tensor.cat([tensor.ones(1, dtype="int8"), tensor.ones(1, dtype="uint8")])`, "int16"},
		{`tensor.ones(2, dtype="int32").sum()`, "int64"},
		{`tensor.ones(2, dtype="float16").mean()`, "float16"},
	} {
		v := f.eval(c.expr).(starlark.HasAttrs)
		dt, _ := v.Attr("dtype")
		if got := dt.String(); got != c.want {
			t.Errorf("%s: dtype %s, want %s", c.expr, got, c.want)
		}
	}
}

// TestNoAllocation checks that in-place ops, out= and views allocate no
// device memory, and that comparisons allocate exactly their bool result.
func TestNoAllocation(t *testing.T) {
	f := newFixture(t, sim.Spec{})
	f.run(`
a = tensor.ones(512, 512, device="cuda")
b = tensor.ones(512, 512, device="cuda")
o = tensor.empty(512, 512, device="cuda")
`)
	f.mgr.Reclaim()
	base := f.allocated()
	for _, stmt := range []string{
		`tensor.add(a, b, out=o)`, `tensor.sub(a, 1, out=o)`, `tensor.mul(a, b, out=o)`, `tensor.div(a, 3, out=o)`,
		`tensor.matmul(a, b, out=o)`, `a.add(b, out=o)`, `tensor.add(o, b, out=o)`,
		`a.add_(b)`, `a.sub_(1)`, `a.mul_(b[0])`, `a.div_(2)`, `a.zero_()`, `a.fill_(2)`, `a.copy_(b)`, `a[3] = b[4]`, `a[3, 4] = 1`,
		`v = a.narrow(0, 1, 10)`, `v = a.select(1, 3)`, `v = a.view(-1)`, `v = a.reshape(256, 1024)`, `v = a.t()`, `v = a.T`,
		`v = a.permute(1, 0)`, `v = a.transpose(0, 1)`, `v = a[1:100:3]`, `v = a[5]`, `v = a[::-1]`, `v = a.unsqueeze(0)`,
		`v = a.unsqueeze(2).squeeze(2)`, `v = a.flatten()`, `v = a.expand(3, 512, 512)`, `v = a.contiguous()`, `v = a.to("cuda")`,
		`v = a.float()`, `v = a.to(dtype="float32")`,
	} {
		peak := f.gpu.Peaks().New(f.gpu.Allocated(), f.gpu.Reserved())
		f.run(stmt)
		if peak.MaxAllocated != base {
			t.Errorf("%s: allocated up to %d bytes, want none", stmt, peak.MaxAllocated-base)
		}
		peak.Close()
	}
	for _, c := range []struct {
		stmt  string
		bytes uint64
	}{
		{`r = a.eq(b)`, 512 * 512},
		{`r = a.lt(1)`, 512 * 512},
		{`r = a + b`, 512 * 512 * 4},
		{`r = a.half()`, 512 * 512 * 2},
		{`r = a.t().contiguous()`, 512 * 512 * 4},
		{`r = a.t().reshape(-1)`, 512 * 512 * 4},
		{`r = a.sum(0)`, 2048}, // 512 floats, one 512-byte-rounded block... of 2 KiB
		{`r = a.max(1)`, 2048 + 4096},
	} {
		f.mgr.Reclaim()
		before := f.allocated()
		peak := f.gpu.Peaks().New(f.gpu.Allocated(), f.gpu.Reserved())
		f.run(c.stmt)
		if got := peak.MaxAllocated - before; got != c.bytes {
			t.Errorf("%s: allocated up to %d bytes, want %d", c.stmt, got, c.bytes)
		}
		peak.Close()
		f.drop("r")
	}
}

// TestMetaParity runs one script statement by statement on a data device
// and on a meta device: after every statement the allocated, reserved and
// peak bytes must be equal, and the meta device holds no host memory.
func TestMetaParity(t *testing.T) {
	data := newFixture(t, sim.Spec{Total: 4 * gib})
	meta := newFixture(t, sim.Spec{Total: 4 * gib, Meta: true})
	script := []string{
		`a = tensor.zeros(1000, 1000, device="cuda")`,
		`b = tensor.ones(1000, 1000, device="cuda", dtype="float16")`,
		`c = tensor.full([333, 777], 2.5, device="cuda")`,
		`d = tensor.empty(12345, device="cuda", dtype="int8")`,
		`e = tensor.rand(100, 100, device="cuda")`,
		`r = tensor.randn(4096, device="cuda", dtype="bfloat16")`,
		`g = tensor.arange(0, 100000, 3, device="cuda")`,
		`h = tensor.zeros_like(a)`,
		`i = tensor.ones_like(b, dtype="float64")`,
		`j = tensor.full_like(c, 7)`,
		`x = a * 2 + 1`,
		`x = a * b - c.sum()`,
		`y = a / 3`,
		`y = b // 2`,
		`y = -a`,
		`y = a.abs().relu().exp().log().sqrt().tanh().sigmoid()`,
		`y = tensor.matmul(a, a)`,
		`y = tensor.matmul(a.view(10, 100, 1000), a[:1000].view(1, 1000, 1000))`,
		`y = a.half().matmul(b)`,
		`y = g.view(1, -1).matmul(g.view(-1, 1))`,
		`y = a.sum()`, `y = a.sum(dim=0, keepdim=True)`, `y = a.mean(dim=(0, 1))`,
		`y = a.max()`, `y = a.max(dim=1)`, `y = b.min(dim=0, keepdim=True)`,
		`y = a.to(dtype="bfloat16")`, `y = a.to(dtype="float16")`, `y = a.clone()`, `y = a.t().contiguous()`,
		`y = a.t().reshape(-1)`, `y = a.t().flatten()`, `y = tensor.cat([a, c.view(-1)[:1000].view(1, 1000)])`,
		`y = tensor.stack([a, a, a], dim=1)`, `y = a.eq(b)`, `y = a.gt(0.5)`,
		`a.add_(1)`, `a.mul_(b)`, `a.zero_()`, `a.fill_(3)`, `a.copy_(b)`, `tensor.add(a, b, out=h)`,
		`y = None`, `x = None`, `gc_ = 0`,
		`z = [tensor.empty(1 << k, device="cuda") for k in range(22)]`,
		`z = None`,
	}
	for _, stmt := range script {
		data.run(stmt)
		meta.run(stmt)
		data.mgr.Reclaim()
		meta.mgr.Reclaim()
		ds, ms := data.gpu.Stats(), meta.gpu.Stats()
		for _, k := range []string{"allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current", "reserved_bytes.all.peak", "requested_bytes.all.current", "segment.all.current", "num_device_alloc"} {
			if ds[k] != ms[k] {
				t.Errorf("after %s: %s: data %d, meta %d", stmt, k, ds[k], ms[k])
			}
		}
	}
	if data.allocated() == 0 {
		t.Error("the script left nothing allocated: the comparison is empty")
	}
	// The same Stats keys, not only the ones compared above.
	if !slices.Equal(slices.Sorted(maps.Keys(data.gpu.Stats())), slices.Sorted(maps.Keys(meta.gpu.Stats()))) {
		t.Error("memory_stats keys differ between data and meta mode")
	}
	if dev, ok := meta.gpu.Device().(*sim.Device); ok && dev.Resident() != 0 {
		t.Errorf("meta device holds %d resident bytes, want 0", dev.Resident())
	}
}

// TestMetaValues: what needs values fails on a meta device, with the
// device named; everything else works.
func TestMetaValues(t *testing.T) {
	f := newFixture(t, sim.Spec{Meta: true, Total: 80 * gib})
	f.run(`
a = tensor.ones(4, 4, device="cuda")
v, i = a.max(dim=0)
big = tensor.empty(8 << 30, device="cuda")  # 32 GiB, on a small host
s = str(a)
r = repr(big[0:2])
`)
	for _, c := range []struct{ src, name string }{
		{`a[0, 0].item()`, "tensor.item"},
		{`a.tolist()`, "tensor.tolist"},
		{`a.sum().item()`, "tensor.item"},
		{`v.tolist()`, "tensor.tolist"},
		{`2 in a`, "tensor.__contains__"},
		{`a.equal(a)`, "tensor.equal"},
		{`tensor.equal(a, a.clone())`, "tensor.equal"},
		{`a.allclose(a)`, "tensor.allclose"},
		{`tensor.ones(4, 4, device="cuda") + tensor.tensor(1.0, device="cuda")`, ""},
	} {
		if c.name == "" {
			f.run(c.src)
			continue
		}
		f.wantErr(c.src, c.name+": device cuda:0 is meta: values are not stored")
	}
	if s := f.globals["s"].(starlark.String); s != "tensor(..., device='cuda:0', size=(4, 4), meta=True)" {
		t.Errorf("str of a meta tensor: %s", s)
	}
	if r := string(f.globals["r"].(starlark.String)); !strings.Contains(r, "size=(2,), meta=True") {
		t.Errorf("repr of a meta view: %s", r)
	}
	f.mgr.Reclaim()
	if got := f.allocated(); got != 32*gib+3*512 {
		t.Errorf("allocated %d", got)
	}
}
