package tensor_test

import (
	"testing"

	"github.com/memsh/memsh/backend/cuda/cudatest"
)

// The GPU dispatch through the stub driver (kernels run on the CPU there,
// so these measure memsh's overhead and the staging path, not a GPU):
//
//	go test ./starlib/tensor -run XXX -bench GPU
func BenchmarkGPUOps(b *testing.B) {
	g := stubFixture(b, cudatest.Config{GPUs: 1, Mem: 2 << 30, NoCtx: true, NoPoison: true})
	if _, err := g.exec("small = tensor.ones([16], device='cuda')\nbig = tensor.ones([1 << 20], device='cuda')"); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct{ name, src string }{
		{"add-kernel/16", "r = small + small"},
		{"add-kernel/1M", "r = big + big"},
		{"exp-staged/16", "r = small.exp()"},
		{"exp-staged/1M", "r = big.exp()"},
		{"item/16", "r = small[3].item()"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for range b.N {
				if _, err := g.exec(bc.src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
