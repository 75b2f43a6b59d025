package scope_test

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
)

// opsProgram decodes fuzz bytes into a Starlark function prog(dev) that
// builds a small program of tensor and autograd ops on device dev and
// returns every value it made. Values are deterministic (arange-based), so
// the program gives the same results on any device.
func opsProgram(data []byte) string {
	i := 0
	next := func() int {
		if i >= len(data) {
			return 0
		}
		b := data[i]
		i++
		return int(b)
	}
	dtypes := []string{"float32", "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"}
	var b strings.Builder
	b.WriteString("def prog(dev):\n    v = []\n")
	line := func(format string, args ...any) { fmt.Fprintf(&b, "    "+format+"\n", args...) }
	pick := func() string { return fmt.Sprintf("v[%d %% len(v)]", next()) }
	create := func() {
		nd := next() % 4
		shape := make([]string, nd)
		n := 1
		for k := range shape {
			d := next() % 4
			if d == 0 && next()%4 != 0 {
				d = 1 + next()%3 // zero-size dims now and then
			}
			shape[k] = fmt.Sprint(d)
			n *= d
		}
		dt := dtypes[next()%len(dtypes)]
		scale := float64(next()%16-8) / 4
		off := float64(next()%16-8) / 2
		rg := ""
		if (dt == "float32" || dt == "float64") && next()%2 == 0 {
			rg = ".requires_grad_()"
		}
		line("v.append(((tensor.arange(%d, dtype=tensor.float64, device=dev) * %g + %g).reshape([%s]).to(tensor.%s))%s)", n, scale, off, strings.Join(shape, ", "), dt, rg)
	}
	create()
	steps := 0
	for i < len(data) && steps < 16 {
		steps++
		switch next() % 16 {
		case 0:
			create()
		case 1:
			op := []string{"+", "-", "*", "/"}[next()%4]
			line("v.append(%s %s %s)", pick(), op, pick())
		case 2:
			sc := []string{"2", "-3", "2.5", "0.1", "True", "0"}[next()%6]
			op := []string{"+", "-", "*", "/"}[next()%4]
			if next()%2 == 0 {
				line("v.append(%s %s %s)", pick(), op, sc)
			} else {
				line("v.append(%s %s %s)", sc, op, pick())
			}
		case 3:
			line("v.append(tensor.matmul(%s, %s))", pick(), pick())
		case 4:
			x := pick()
			switch next() % 9 {
			case 0:
				line("v.append(%s.t())", x)
			case 1:
				line("v.append(%s.transpose(0, -1))", x)
			case 2:
				line("v.append(%s.reshape([-1]))", x)
			case 3:
				line("v.append(%s.view([-1]))", x)
			case 4:
				line("v.append(%s.narrow(0, %d, 1))", x, next()%3)
			case 5:
				line("v.append(%s.select(0, %d))", x, next()%3-1)
			case 6:
				line("v.append(%s[%d:])", x, next()%3)
			case 7:
				line("v.append(%s.contiguous())", x)
			case 8:
				line("v.append(%s.permute([%d, %d]))", x, next()%2, next()%2)
			}
		case 5:
			x := pick()
			switch next() % 6 {
			case 0:
				line("v.append(%s.sum())", x)
			case 1:
				line("v.append(%s.mean())", x)
			case 2:
				line("v.append(%s.max())", x)
			case 3:
				line("v.append(%s.min())", x)
			case 4:
				line("v.append(%s.sum(%d))", x, next()%3-1)
			case 5:
				line("v.append(%s.mean(dim=%d))", x, next()%2)
			}
		case 6:
			op := []string{"tanh", "relu", "abs", "exp", "sigmoid", "neg", "sqrt", "log"}[next()%8]
			line("v.append(%s.%s())", pick(), op)
		case 7:
			x := pick()
			switch next() % 6 {
			case 0:
				line("v.append(nn.functional.softmax(%s, dim=-1))", x)
			case 1:
				line("v.append(nn.functional.log_softmax(%s, dim=-1))", x)
			case 2:
				line("v.append(nn.functional.gelu(%s))", x)
			case 3:
				line("v.append(nn.functional.silu(%s))", x)
			case 4:
				line("v.append(nn.functional.mse_loss(%s, %s))", x, pick())
			case 5:
				line("v.append(nn.functional.layer_norm(%s, %s.shape[-1:]))", x, x)
			}
		case 8:
			x := pick()
			line("%s.sum().backward(retain_graph=%s)", x, []string{"False", "True"}[next()%2])
			line("v.extend([t.grad for t in v if t.is_leaf and t.grad != None])")
		case 9:
			op := []string{"eq", "ne", "lt", "le", "gt", "ge"}[next()%6]
			line("v.append(%s.%s(%s))", pick(), op, pick())
		case 10:
			op := []string{"add_", "mul_", "zero_", "copy_"}[next()%4]
			x := pick()
			switch op {
			case "zero_":
				line("v.append(%s.zero_())", x)
			default:
				line("v.append(%s.%s(%s))", x, op, pick())
			}
		case 11:
			line("v.append(tensor.%s([%s, %s]))", []string{"cat", "stack"}[next()%2], pick(), pick())
		case 12:
			line("v.append(%s.to(tensor.%s))", pick(), dtypes[next()%len(dtypes)])
		case 13:
			// A 0-dim cpu tensor mixes with tensors on any device.
			dt := dtypes[next()%len(dtypes)]
			op := []string{"+", "*", "-"}[next()%3]
			line("v.append(tensor.tensor(%d, dtype=tensor.%s) %s %s)", next()%5-2, dt, op, pick())
		case 14:
			x := pick()
			line("v.append(tensor.where(%s.gt(0), %s, %s))", x, x, pick())
		case 15:
			line("v.append(%s.clone().detach())", pick())
		}
	}
	b.WriteString("    return v\n")
	return b.String()
}

const opsCompare = `
rc = trial(prog, "cpu")
rg = trial(prog, "cuda")
status = (rc.status, rg.status)
err = (rc.error, rg.error)
mismatch = None
errn = [str(e).replace("torch.cuda.", "torch.").replace("cuda:0", "DEV").replace("cuda", "DEV").replace("cpu", "DEV") for e in (rc.error, rg.error)]
same_err = errn[0] == errn[1]
if rc.status == "ok" and rg.status == "ok":
    if len(rc.value) != len(rg.value):
        mismatch = "lengths %d %d" % (len(rc.value), len(rg.value))
    else:
        for k in range(len(rc.value)):
            a = rc.value[k]
            g = rg.value[k]
            if a.dtype != g.dtype or a.shape != g.shape or str(g.device) != "cuda:0" and g.ndim > 0:
                mismatch = "value %d: %s %s %s vs %s %s %s" % (k, a.dtype, a.shape, a.device, g.dtype, g.shape, g.device)
                break
            tol = 1e-2 if a.dtype in (tensor.float16, tensor.bfloat16) else 1e-4
            if not a.to(tensor.float64).allclose(g.to("cpu").to(tensor.float64), rtol=tol, atol=tol, equal_nan=True):
                mismatch = "value %d differs: %s vs %s" % (k, a, g.to("cpu"))
                break
rc = None
rg = None
a = None
g = None
`

// FuzzTensorOps runs a program of tensor and autograd ops decoded from the
// input on a simulated GPU with data and on the cpu. Invariants: no panic;
// failures are ordinary errors, the same on both devices; results agree
// (dtype, shape, allclose); nothing stays allocated once the values are
// dropped. The seed corpus (testdata/fuzz/FuzzTensorOps) runs with `go test`.
// opsSession is FuzzTensorOps' Session, shared by the inputs one process
// runs.
var opsSession *scope.Session

func FuzzTensorOps(f *testing.F) {
	f.Add([]byte{0, 2, 3, 0, 1, 4, 4, 1, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 256 {
			return
		}
		src := opsProgram(data)
		// One Session per fuzzing process, reset after every input (its
		// globals dropped and every byte back, which the test checks):
		// making a Session per input cost ~100 ms, and fuzzing needs
		// millions of inputs. Lazy peak mode: the invariants are about
		// agreement and leaks, not peaks, and exact mode's reclaims would
		// dominate the time.
		if opsSession == nil {
			s, err := scope.New(scope.Options{Device: "sim:64MiB", Peak: backend.PeakLazy, Out: io.Discard, Err: io.Discard, Quiet: true, MaxSteps: 100000})
			if err != nil {
				t.Fatal(err)
			}
			opsSession = s
		}
		s := opsSession
		// An input that panics or fails leaves the Session mid-statement
		// or dirty: the next input (the fuzzer's minimizer runs more in
		// this process) gets a fresh one, so the first failure is what is
		// reported.
		done := false
		defer func() {
			if !done {
				opsSession = nil
			}
		}()
		if err := s.Exec("prog.star", src); err != nil {
			t.Fatalf("%v\n%s", err, src)
		}
		if err := s.Exec("compare.star", opsCompare); err != nil {
			t.Fatalf("%v\n%s", err, src)
		}
		status, errs := s.Get("status").String(), s.Get("err").String()
		if testing.Verbose() {
			t.Logf("%s%s %s", src, status, errs)
		}
		for _, bad := range []string{"panic", "runtime error", "nil pointer", "index out of range [", "internal error", "freed as unreachable"} {
			if strings.Contains(errs, bad) {
				t.Fatalf("not an ordinary error: %s\n%s", errs, src)
			}
		}
		if status != `("ok", "ok")` {
			if status != `("error", "error")` || s.Get("same_err").String() != "True" {
				t.Fatalf("cpu and cuda differ: %s %s\n%s", status, errs, src)
			}
		}
		if m := s.Get("mismatch").String(); m != "None" {
			t.Fatalf("cpu and cuda results differ: %s\n%s", m, src)
		}
		for name := range s.Globals() {
			s.Set(name, nil)
		}
		s.Manager().Reclaim()
		if n := s.Manager().GPU(0).Allocated(); n != 0 {
			t.Fatalf("cuda:0: %d bytes still allocated after dropping the values\n%s", n, src)
		}
		if n := s.Manager().Host().Allocated(); n != 0 {
			t.Fatalf("host: %d bytes still allocated after dropping the values\n%s", n, src)
		}
		done = true
	})
}
