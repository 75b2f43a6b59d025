package fit

import (
	"cmp"
	_ "embed"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/record"
	"github.com/memsh/memsh/scope"
)

//go:embed driver.star
var driverSrc string

// Steps is the number of training steps of every trial: the second step's
// backward runs with the optimizer state of the first already there.
const Steps = 2

// run is one search: a Session on a simulated card, the driver loaded.
type run struct {
	o     Options
	m     *Model
	lib   fs.FS
	gpu   string // the --gpu value of this run (a preset or a size)
	s     *scope.Session
	table io.Writer // where the sweeps print their trial tables
	// closed is Options.Started's function for s, or nil
	closed func()
}

// sessionFor opens a Session on gpu's meta simulator with the driver and
// the model's builders loaded.
func sessionFor(o Options, m *Model, lib fs.FS, gpu string, table, stderr io.Writer) (*run, error) {
	device := "sim:" + gpu + ",meta"
	so := scope.Options{Device: device, Peak: backend.PeakExact, Out: table, Err: stderr, Quiet: true, Library: lib, Argv: []string{}}
	var load string
	var defined []string // the driver's names this kind loads
	switch m.Kind {
	case KindNanoGPT:
		load = fmt.Sprintf("load(\"models/gpt2.star\", \"gpt2\", %q)\nPRESET = %s\n", m.Entry.Preset, m.Entry.Preset)
		defined = []string{"gpt2"}
	case KindResNet:
		load = fmt.Sprintf("load(\"models/resnet.star\", \"resnet\", %q)\nPRESET = %s\n", m.Entry.Preset, m.Entry.Preset)
		defined = []string{"resnet"}
	case KindHF:
		load = "load(\"models/hf.star\", \"from_config\", \"needs_eager\", hf_inputs = \"inputs\", hf_spec = \"spec\")\nload(\"models/generate.star\", \"generate\")\nPRESET = None\n"
		defined = []string{"from_config", "needs_eager", "hf_inputs", "hf_spec", "generate"}
	case KindStar:
		abs, err := filepath.Abs(m.Star)
		if err != nil {
			return nil, err
		}
		so.LoadPath = []string{filepath.Dir(abs)}
		names := []string{`"build"`, `"inputs"`}
		for _, opt := range starOptionals(m) {
			names = append(names, strconv.Quote(opt))
		}
		load = fmt.Sprintf("load(%q, %s)\nPRESET = None\n", abs, strings.Join(names, ", "))
		defined = []string{"build", "inputs"}
	}
	// every kind's optimizer (Trainer's optim names)
	load += "load(\"models/trainer.star\", \"trainer_optimizer\")\n"
	// the names the driver refers to that this kind does not load
	for _, name := range []string{"gpt2", "resnet", "from_config", "needs_eager", "hf_inputs", "hf_spec", "generate", "build", "inputs"} {
		if !slices.Contains(defined, name) {
			load += name + " = None\n"
		}
	}
	s, err := scope.New(so)
	if err != nil {
		return nil, err
	}
	r := &run{o: o, m: m, lib: lib, gpu: gpu, s: s, table: table}
	if o.Started != nil {
		r.closed = o.Started(s)
	}
	if m.HF != nil {
		s.Set("CONFIG_JSON", starlark.String(m.HF.Raw))
	}
	routing := o.Routing
	if routing == "" {
		routing = "balanced"
	}
	finetune := o.Finetune
	if finetune == "" {
		finetune = FinetuneFull
	}
	spec := fmt.Sprintf(`SPEC = dict(kind = %q, preset = PRESET, config = %s, attention = %q, precision = %q, optimizer = %q, checkpoint = %s, sequence = %s, inference = %s, max_new_tokens = %d, kv_cache = %q, grad_accum = %d, routing = %q, finetune = %q, lora_r = %d, lora_alpha = %s, lora_dropout = %s, lora_targets = %s, gpus = %d, parallel = %q, tp = %d, tp_fsdp = %s)
`, m.Kind, configExpr(m), o.Attention, o.Precision, o.Optimizer, pyBool(o.Checkpoint), pyBool(m.Sequence), pyBool(o.Inference), o.MaxNewTokens, o.KVCache, max(1, o.GradAccum), routing,
		finetune, o.LoRAR, pyFloat(o.LoRAAlpha), pyFloat(o.LoRADropout), loraTargetsExpr(o.loraTargets), max(1, o.GPUs), o.Parallel, o.TP, pyBool(o.TPFSDP))
	if err := s.Exec("<memsh fit>", load+spec+driverSrc); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// pyFloat is f as a Starlark float literal.
func pyFloat(f float64) string { return starlark.Float(f).String() }

// loraTargetsExpr is nn.lora's target_modules: "all-linear", or a list of
// names.
func loraTargetsExpr(ts []string) string {
	if len(ts) == 1 && ts[0] == "all-linear" {
		return `"all-linear"`
	}
	q := make([]string, len(ts))
	for i, t := range ts {
		q[i] = strconv.Quote(t)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func configExpr(m *Model) string {
	if m.HF != nil {
		return "json.decode(CONFIG_JSON)"
	}
	return "None"
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// starOptionals lists the optional names a .star model file defines at
// top level (PARAMETERS, MAX_SEQ), so that the driver loads them.
func starOptionals(m *Model) []string { return m.starNames }

// close ends the run's Session.
func (r *run) close() {
	r.s.Close()
	if r.closed != nil {
		r.closed()
	}
}

// eval runs code in the run's Session and returns the global name.
func (r *run) eval(code, name string) (starlark.Value, error) {
	if err := r.s.Exec("<memsh fit>", code); err != nil {
		return nil, err
	}
	v := r.s.Get(name)
	r.s.Set(name, nil)
	return v, nil
}

// withOutput runs f with the Session's output sent to w.
func (r *run) withOutput(w io.Writer, f func() error) error {
	prev := r.s.Output()
	r.s.SetOutput(w)
	defer r.s.SetOutput(prev)
	return f()
}

// Search is one boundary search: over the batch at a sequence length,
// or over the sequence length at a batch.
type Search struct {
	What  string // "batch" or "seq"
	Batch int    // the batch of a sequence search
	Seq   int    // the sequence of a batch search (0: an image model)
	Low   int
	High  int // 0: no bound
	// Largest fits, FirstOOM does not; 0 when none / not found.
	Largest, FirstOOM int
	Trials            []Trial
}

// Trial is one search trial.
type Trial struct {
	Value  int    `json:"value"` // the batch or sequence tried
	Status string `json:"status"`
	// PeakAllocated is the trial's peak allocated bytes on the card.
	PeakAllocated int64 `json:"peak_allocated"`
	// Replayed: answered by replaying the memory events recorded from
	// the search's full trials (sweep.max_fit(replay=True)), not run
	Replayed bool `json:"replayed"`
}

// search runs sweep.max_fit over what (in exact peak mode, as one fresh
// process per search: fresh="search"; replay=True).
func (r *run) search(what string, batch, seq, low, high int, name string) (*Search, error) {
	sr := &Search{What: what, Batch: batch, Seq: seq, Low: low, High: high}
	seqArg := "None"
	if seq > 0 {
		seqArg = strconv.Itoa(seq)
	}
	fn := fmt.Sprintf("lambda batch: step(batch, %s)", seqArg)
	// under sequence parallelism a sequence splits over the T ranks
	// evenly (torchtitan requires it): the sequence is searched in units
	// of T
	unit := 1
	if what == "seq" && r.o.TP > 1 {
		unit = r.o.TP
		low, high = (low+unit-1)/unit, high/unit
	}
	if what == "seq" {
		fn = fmt.Sprintf("lambda seq: step(%d, seq * %d)", batch, unit)
	}
	hi := "None"
	if high > 0 {
		hi = strconv.Itoa(high)
	}
	code := fmt.Sprintf("R = sweep.max_fit(%s, low = %d, high = %s, mode = %q, max_trials = 40, search = \"exact\", fresh = \"search\", replay = True, name = %q)\n", fn, low, hi, cmp.Or(r.o.SearchMode, SearchBinsearch), name)
	v, err := r.eval(code, "R")
	if err != nil {
		return nil, err
	}
	sr.Largest = intAttr(v, "fit") * unit
	sr.FirstOOM = intAttr(v, "oom") * unit
	trials, _ := attr(v, "trials").(*starlark.List)
	for i := 0; trials != nil && i < trials.Len(); i++ {
		t := trials.Index(i)
		var n int
		if params, ok := attr(t, "params").(*starlark.Dict); ok {
			for _, kv := range params.Items() {
				n = toInt(kv[1])
			}
		}
		tr := Trial{Value: n * unit, Status: strAttr(t, "status")}
		if rp, ok := attr(t, "replayed").(starlark.Bool); ok {
			tr.Replayed = bool(rp)
		}
		if gpu := attr(attr(t, "data"), "gpu"); gpu != nil {
			tr.PeakAllocated = int64(intAttr(gpu, "peak"))
		}
		sr.Trials = append(sr.Trials, tr)
	}
	return sr, nil
}

// Measurement is a trial at one size under nn.track_peak.
type Measurement struct {
	Batch, Seq   int
	Status       string // "ok" or "oom"
	Error        string
	MaxAllocated int64
	MaxReserved  int64
	Outside      int64 // the card's memory outside the allocator (context, cuBLAS handles)
	Total        int64
	Phase        string           // what ran at the peak
	Peak         map[string]int64 // memtrack's categories at the peak
	Failed       map[string]int64 // at the failure (an OOM)
	Generation   map[string]int64 // --inference: generate()'s figures (prefill_peak, peak, kv_cache)
	GenPhase     string           // --inference: "prefill" or "decode"
	Requested    int64            // the allocation that did not fit
	Paged        int64            // the optimizer's state in paged memory (bitsandbytes' paged optimizers), outside the allocator
	HostPeak     int64            // the host allocator's peak in the trial ("cpu" tensors: CPU offload's state)
}

// measure runs the driver's measure(b, s) in exact peak mode, quietly.
func (r *run) measure(batch, seq int) (*Measurement, error) {
	seqArg := "None"
	if seq > 0 {
		seqArg = strconv.Itoa(seq)
	}
	mgr := r.s.Manager()
	prev := mgr.PeakMode()
	mgr.SetPeakMode(backend.PeakExact)
	defer mgr.SetPeakMode(prev)
	var requested uint64 // the last allocation that did not fit
	stop := mgr.Observe(func(e backend.Event) {
		if e.Kind == backend.EventOOM {
			requested = e.Size
		}
	})
	defer stop()
	var v starlark.Value
	err := r.withOutput(io.Discard, func() error {
		var err error
		v, err = r.eval(fmt.Sprintf("M = measure(%d, %s)\n", batch, seqArg), "M")
		return err
	})
	if err != nil {
		return nil, err
	}
	d, _ := v.(*starlark.Dict)
	get := func(k string) starlark.Value {
		x, _, _ := d.Get(starlark.String(k))
		return x
	}
	ms := &Measurement{Batch: batch, Seq: seq, Status: toStr(get("status")), Error: toStr(get("error")),
		MaxAllocated: int64(toInt(get("max_allocated"))), MaxReserved: int64(toInt(get("max_reserved"))),
		Outside: int64(toInt(get("outside"))), Total: int64(toInt(get("total"))), Phase: toStr(get("phase")),
		Peak: toMap(get("peak")), Failed: toMap(get("failed")), Paged: int64(toInt(get("paged"))),
		HostPeak: int64(toInt(get("host_peak")))}
	if g, ok := get("generation").(*starlark.Dict); ok {
		ms.Generation = toMap(g)
		if ph, _, _ := g.Get(starlark.String("peak_phase")); ph != nil {
			ms.GenPhase = toStr(ph)
		}
	}
	if ms.Status == "oom" {
		ms.Requested = int64(requested)
	}
	return ms, nil
}

// describeModel returns the built model's parameters.
type modelInfo struct {
	// Parameters counts the base model's (a 4-bit weight its weights,
	// the adapters not); Trainable those that require grad; Adapters the
	// LoRA adapters' (in AdapterModules wrapped layers).
	Parameters, Trainable, Adapters int64
	AdapterModules                  int
	// ParamBytes is every parameter's bytes on the card, TrainableBytes
	// the trainable ones', QuantBytes the 4-bit weights' quantization
	// states' (each tensor rounded as the allocator rounds).
	ParamBytes, TrainableBytes, QuantBytes int64
	Params                                 []ParamInfo
	// TrainableShapes are the trainable parameters' shapes (adapters
	// included): the optimizer keeps state for these.
	TrainableShapes [][]int
	DType           string
	// Rank is what one rank holds under tensor parallelism (its
	// parameters' chunks; nil without).
	Rank *modelInfo
}

func (r *run) describe() (*modelInfo, error) {
	v, err := r.eval("D = describe()\n", "D")
	if err != nil {
		return nil, err
	}
	d, _ := v.(*starlark.Dict)
	mi := infoOf(d)
	if rd, ok := dictGet(d, "rank").(*starlark.Dict); ok {
		mi.Rank = infoOf(rd)
	}
	return mi, nil
}

func dictGet(d *starlark.Dict, k string) starlark.Value {
	if d == nil {
		return nil
	}
	x, _, _ := d.Get(starlark.String(k))
	return x
}

// infoOf reads describe_model()'s dict.
func infoOf(d *starlark.Dict) *modelInfo {
	get := func(k string) starlark.Value { return dictGet(d, k) }
	i64 := func(k string) int64 { return int64(toInt(get(k))) }
	mi := &modelInfo{Parameters: i64("parameters"), Trainable: i64("trainable"), Adapters: i64("adapters"), AdapterModules: toInt(get("adapter_modules")),
		ParamBytes: i64("param_bytes"), TrainableBytes: i64("trainable_bytes"), QuantBytes: i64("quant_bytes"), DType: toStr(get("dtype"))}
	shapeOf := func(v starlark.Value) []int {
		var shape []int
		if sl, ok := v.(*starlark.List); ok {
			for j := 0; j < sl.Len(); j++ {
				shape = append(shape, toInt(sl.Index(j)))
			}
		}
		return shape
	}
	if l, ok := get("params").(*starlark.List); ok {
		for i := 0; i < l.Len(); i++ {
			t, _ := l.Index(i).(starlark.Tuple)
			if len(t) != 2 {
				continue
			}
			mi.Params = append(mi.Params, ParamInfo{Name: toStr(t[0]), Shape: shapeOf(t[1])})
		}
	}
	if l, ok := get("trainable_shapes").(*starlark.List); ok {
		for i := 0; i < l.Len(); i++ {
			mi.TrainableShapes = append(mi.TrainableShapes, shapeOf(l.Index(i)))
		}
	}
	return mi
}

// backendName is the attention the model runs: for SDPA the backend
// PyTorch picks on this card.
func (r *run) attention(seq int) (string, error) {
	v, err := r.eval(fmt.Sprintf("A = sdpa_backend(%d)\n", seq), "A")
	if err != nil {
		return "", err
	}
	if v == nil || v == starlark.None {
		return "", nil
	}
	return toStr(v), nil
}

// openOut opens --out for the run's records.
func (r *run) openOut(path string) (func(), error) {
	st := record.Of(r.s.Env())
	if err := st.Open(path); err != nil {
		return nil, err
	}
	return func() { st.Close() }, nil
}

// presetOf returns the card's preset (nil for a size).
func presetOf(gpu string) *sim.Preset {
	if p, ok := sim.LookupPreset(gpu); ok {
		return &p
	}
	return nil
}

// --- Starlark values ---

func attr(v starlark.Value, name string) starlark.Value {
	h, ok := v.(starlark.HasAttrs)
	if !ok {
		return nil
	}
	x, _ := h.Attr(name)
	return x
}

func intAttr(v starlark.Value, name string) int { return toInt(attr(v, name)) }

func strAttr(v starlark.Value, name string) string { return toStr(attr(v, name)) }

func toInt(v starlark.Value) int {
	if i, ok := v.(starlark.Int); ok {
		n, _ := i.Int64()
		return int(n)
	}
	return 0
}

func toStr(v starlark.Value) string {
	if s, ok := v.(starlark.String); ok {
		return string(s)
	}
	return ""
}

func toMap(v starlark.Value) map[string]int64 {
	d, ok := v.(*starlark.Dict)
	if !ok {
		return nil
	}
	m := map[string]int64{}
	for _, kv := range d.Items() {
		m[toStr(kv[0])] = int64(toInt(kv[1]))
	}
	return m
}
