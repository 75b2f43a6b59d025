// Command tensorbench times memsh's tensor module on float32 elementwise
// add and matmul (1024², 2048², 4096²) inside a memsh Session, compares each
// figure with NumPy's for the same statement (from numpy_bench.py's JSON),
// and expresses it as a fraction of the machine's memory bandwidth (add)
// and peak FLOP/s (matmul). With -python, it runs numpy_bench.py size by
// size between its own measurements; run.sh does that with Debian's
// python3-numpy.
//
// Usage:
//
//	go run ./bench/tensor [-python /usr/bin/python3] [-sizes 1024,2048,4096] [-devices cpu,cuda] [-rounds 3]
//
// Operations, each a Starlark function called once per timed repetition
// (so the figures include the call, the allocation of results and memsh's
// reclaims, as a user's statement would):
//
//	add_out     tensor.add(a, b, out=c)     no allocation: the kernel
//	add         d = a + b                   allocates the result
//	matmul_out  tensor.matmul(a, b, out=c)
//	matmul      d = tensor.matmul(a, b)
//
// Each operation is timed in -rounds rounds (default 3) of a fixed number
// of repetitions; the figure is the lowest round mean (the machine may be
// shared: the best round is the least disturbed one), and the minimum of
// single repetitions is shown too. The NumPy ratio is memsh's figure over
// NumPy's, measured the same way. Bandwidth is measured
// with STREAM's convention (a copy moves 2 bytes per byte copied; a + b
// moves 12 bytes per float32 element), as the best of a parallel Go copy
// of 512 MiB and NumPy's single-thread copy. Peak FLOP/s is the best
// sgemm rate measured (NumPy's and memsh's matmuls, 2·n³ flops each), not
// a datasheet figure.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/tensor"
)

const mib = 1 << 20

type result struct {
	Op     string  `json:"op"`
	N      int     `json:"n"`
	Device string  `json:"device,omitempty"`
	Mean   float64 `json:"mean_s"`
	Min    float64 `json:"min_s"`
	Reps   int     `json:"reps"`
}

type numpyFile struct {
	Version   string   `json:"numpy_version"`
	BLAS      []string `json:"blas"`
	Bandwidth float64  `json:"bandwidth_gbs"`
	Results   []result `json:"results"`
}

// reps returns the warm-up and timed repetitions of op at size n (the
// same rule as numpy_bench.py). The warm-up of add covers more than the
// Manager's 256 MiB reclaim pacing, so memsh runs in its steady state.
func reps(op string, n int) (warm, count int) {
	if strings.HasPrefix(op, "add") {
		count = map[int]int{1024: 300, 2048: 100}[n]
		if count == 0 {
			count = 30
		}
		return 320*mib/(4*n*n) + 2, count
	}
	count = map[int]int{1024: 20, 2048: 5}[n]
	if count == 0 {
		count = 3
	}
	return 2, count
}

func main() {
	python := flag.String("python", "", "a Python with NumPy: compare with numpy_bench.py run by it")
	sizesFlag := flag.String("sizes", "1024,2048,4096", "matrix sizes")
	devicesFlag := flag.String("devices", "cpu,cuda", "memsh devices: cpu (host memory) and cuda (the simulated GPU)")
	measureBW := flag.Bool("bandwidth", true, "measure the memory bandwidth")
	rounds := flag.Int("rounds", 3, "timed rounds per operation; the round with the lowest mean counts")
	flag.Parse()
	var sizes []int
	for s := range strings.SplitSeq(*sizesFlag, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			log.Fatalf("bad size %q", s)
		}
		sizes = append(sizes, n)
	}
	var np numpyFile
	if *python != "" {
		np = runNumPy(*python, "--bandwidth", "")
	}

	goBW := 0.0
	if *measureBW {
		goBW = copyBandwidth()
	}
	s, err := scope.New(scope.Options{Device: "sim:16GiB", Out: io.Discard, Err: io.Discard, Quiet: true})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	// Size by size, NumPy then memsh's devices, so that both meet the same
	// machine conditions.
	var res []result
	for _, n := range sizes {
		if *python != "" {
			np.Results = append(np.Results, runNumPy(*python, strconv.Itoa(n)).Results...)
		}
		for _, dev := range strings.Split(*devicesFlag, ",") {
			res = append(res, runSize(s, dev, n, *rounds)...)
		}
	}
	blasName, blasErr := tensor.BLAS()
	if blasErr != nil {
		blasName += " (" + blasErr.Error() + ")"
	}
	report(os.Stdout, res, np, goBW, blasName)
}

// runNumPy runs numpy_bench.py (next to this file) with python and args.
func runNumPy(python string, args ...string) numpyFile {
	_, self, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(self), "numpy_bench.py")
	cmd := exec.Command(python, append([]string{script}, args...)...)
	cmd.Stderr = os.Stderr
	data, err := cmd.Output()
	if err != nil {
		log.Fatalf("%s %s: %v", python, script, err)
	}
	var np numpyFile
	if err := json.Unmarshal(data, &np); err != nil {
		log.Fatalf("%s: %v", script, err)
	}
	return np
}

// runSize times the four operations on n×n float32 tensors on device,
// each in rounds rounds.
func runSize(s *scope.Session, device string, n, rounds int) []result {
	src := fmt.Sprintf(`
a = tensor.rand(%[1]d, %[1]d, device=%[2]q)
b = tensor.rand(%[1]d, %[1]d, device=%[2]q)
c = tensor.empty(%[1]d, %[1]d, device=%[2]q)
def add_out():
    tensor.add(a, b, out=c)
def add():
    d = a + b
def matmul_out():
    tensor.matmul(a, b, out=c)
def matmul():
    d = tensor.matmul(a, b)
`, n, device)
	if err := s.Exec("setup.star", src); err != nil {
		log.Fatal(err)
	}
	var out []result
	for _, op := range []string{"add_out", "add", "matmul_out", "matmul"} {
		fn := s.Get(op)
		warm, count := reps(op, n)
		call := func() {
			if _, err := starlark.Call(s.Thread(), fn, nil, nil); err != nil {
				log.Fatalf("%s %d %s: %v", op, n, device, err)
			}
		}
		for range warm {
			call()
		}
		r := result{Op: op, N: n, Device: device, Mean: 1e9, Min: 1e9, Reps: count}
		for range rounds {
			var total float64
			for range count {
				t0 := time.Now()
				call()
				d := time.Since(t0).Seconds()
				total += d
				r.Min = min(r.Min, d)
			}
			r.Mean = min(r.Mean, total/float64(count))
		}
		fmt.Fprintf(os.Stderr, "memsh %s %d %s: mean %.3f ms\n", op, n, device, r.Mean*1e3)
		out = append(out, r)
	}
	if err := s.Exec("cleanup.star", "a = None\nb = None\nc = None\ngc()\n"); err != nil {
		log.Fatal(err)
	}
	return out
}

// copyBandwidth is the best of 5 parallel copies of 512 MiB (one
// goroutine per CPU), in GB/s with STREAM's convention.
func copyBandwidth() float64 {
	const size = 512 * mib
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	p := runtime.GOMAXPROCS(0)
	best := 1e9
	for range 6 {
		t0 := time.Now()
		var wg sync.WaitGroup
		for i := range p {
			lo, hi := i*size/p, (i+1)*size/p
			wg.Go(func() { copy(dst[lo:hi], src[lo:hi]) })
		}
		wg.Wait()
		best = min(best, time.Since(t0).Seconds())
	}
	return 2 * size / best / 1e9
}

func report(w io.Writer, res []result, np numpyFile, goBW float64, blasName string) {
	bw := max(goBW, np.Bandwidth)
	npRes := map[string]result{}
	peak := 0.0
	for _, r := range np.Results {
		npRes[r.Op+"/"+strconv.Itoa(r.N)] = r
	}
	for _, r := range append(append([]result(nil), res...), np.Results...) {
		if strings.HasPrefix(r.Op, "matmul") {
			peak = max(peak, flops(r.N)/r.Min/1e9)
		}
	}
	fmt.Fprintf(w, "CPU: %s, %d cores; Go %s; memsh BLAS: %s\n", cpuModel(), runtime.NumCPU(), runtime.Version(), blasName)
	if np.Version != "" {
		fmt.Fprintf(w, "NumPy %s, BLAS %s\n", np.Version, strings.Join(np.BLAS, ", "))
	}
	fmt.Fprintf(w, "memory bandwidth: %.1f GB/s (Go parallel copy %.1f, NumPy copy %.1f); peak: %.1f GFLOP/s (best sgemm measured)\n\n", bw, goBW, np.Bandwidth, peak)
	fmt.Fprintln(w, "| op | n | memsh device | memsh mean (min) ms | NumPy mean (min) ms | memsh / NumPy: means (mins) | goal, on means | rate | of peak |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range res {
		nr, ok := npRes[r.Op+"/"+strconv.Itoa(r.N)]
		npCol, ratioCol, goalCol := "–", "–", "–"
		if ok {
			npCol = fmt.Sprintf("%.3f (%.3f)", nr.Mean*1e3, nr.Min*1e3)
			ratio := r.Mean / nr.Mean
			goal := 1.5
			if strings.HasPrefix(r.Op, "matmul") {
				goal = 2
			}
			ratioCol = fmt.Sprintf("%.2f× (%.2f×)", ratio, r.Min/nr.Min)
			goalCol = fmt.Sprintf("≤ %.1f× %s", goal, map[bool]string{true: "met", false: "missed"}[ratio <= goal])
		}
		var rate, frac string
		if strings.HasPrefix(r.Op, "matmul") {
			g := flops(r.N) / r.Mean / 1e9
			rate, frac = fmt.Sprintf("%.1f GFLOP/s", g), fmt.Sprintf("%.0f %%", 100*g/peak)
		} else {
			g := 12 * float64(r.N) * float64(r.N) / r.Mean / 1e9
			rate, frac = fmt.Sprintf("%.1f GB/s", g), fmt.Sprintf("%.0f %%", 100*g/bw)
		}
		fmt.Fprintf(w, "| %s | %d² | %s | %.3f (%.3f) | %s | %s | %s | %s | %s |\n",
			r.Op, r.N, r.Device, r.Mean*1e3, r.Min*1e3, npCol, ratioCol, goalCol, rate, frac)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "NumPy's own rates, for the same ops:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| op | n | NumPy mean ms | rate | of peak |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, r := range np.Results {
		if strings.HasPrefix(r.Op, "matmul") {
			g := flops(r.N) / r.Mean / 1e9
			fmt.Fprintf(w, "| %s | %d² | %.3f | %.1f GFLOP/s | %.0f %% |\n", r.Op, r.N, r.Mean*1e3, g, 100*g/peak)
		} else {
			g := 12 * float64(r.N) * float64(r.N) / r.Mean / 1e9
			fmt.Fprintf(w, "| %s | %d² | %.3f | %.1f GB/s | %.0f %% |\n", r.Op, r.N, r.Mean*1e3, g, 100*g/bw)
		}
	}
}

func flops(n int) float64 { return 2 * float64(n) * float64(n) * float64(n) }

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for l := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
