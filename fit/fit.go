package fit

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	tdist "github.com/memsh/memsh/tensor/dist"
	"github.com/memsh/memsh/tensor/optim"
)

// Main runs `memsh fit` with validated-as-it-goes options and returns the
// exit status: 0 answered, 1 a failure (a model that does not build), 2 a
// usage error (one line on stderr).
func Main(o Options, lib fs.FS, stdout, stderr io.Writer) int {
	m, err := Resolve(o.Source, lib)
	if err == nil && m.Kind == KindStar {
		err = m.readStarNames()
	}
	if err != nil {
		fmt.Fprintln(stderr, "memsh fit:", err)
		if IsUsage(err) {
			return 2
		}
		return 1
	}
	warnings, err := o.Validate(m)
	if err != nil {
		fmt.Fprintln(stderr, "memsh fit:", err)
		return 2
	}
	for _, w := range warnings {
		fmt.Fprintln(stderr, "memsh fit:", w)
	}
	table := stdout
	if o.JSON {
		table = io.Discard
	}
	rep, err := Fit(o, m, lib, table, stderr)
	if err != nil {
		if IsUsage(err) {
			fmt.Fprintln(stderr, "memsh fit:", err)
			return 2
		}
		var ee *starlark.EvalError
		if errors.As(err, &ee) {
			fmt.Fprintln(stderr, ee.Backtrace())
		} else {
			fmt.Fprintln(stderr, "memsh fit:", err)
		}
		return 1
	}
	if o.JSON {
		if err := rep.WriteJSON(stdout); err != nil {
			fmt.Fprintln(stderr, "memsh fit:", err)
			return 1
		}
		return 0
	}
	rep.WriteText(stdout)
	return 0
}

// readStarNames finds which optional names a .star model defines at top
// level (PARAMETERS, MAX_SEQ, SEQ), so that the driver loads them.
func (m *Model) readStarNames() error {
	src, err := os.ReadFile(m.Star)
	if err != nil {
		return usageErr("%s: %v", m.Star, unwrapPath(err))
	}
	f, err := syntax.Parse(m.Star, src, 0)
	if err != nil {
		return fmt.Errorf("%v", err)
	}
	has := map[string]bool{}
	for _, st := range f.Stmts {
		switch st := st.(type) {
		case *syntax.AssignStmt:
			if id, ok := st.LHS.(*syntax.Ident); ok {
				has[id.Name] = true
			}
		case *syntax.DefStmt:
			has[st.Name.Name] = true
		}
	}
	for _, need := range []string{"build", "inputs"} {
		if !has[need] {
			return usageErr("%s: a model file defines build(device, checkpoint) and inputs(batch, seq, device); it has no %s", m.Star, need)
		}
	}
	for _, opt := range []string{"PARAMETERS", "MAX_SEQ"} {
		if has[opt] {
			m.starNames = append(m.starNames, opt)
		}
	}
	m.Sequence = has["MAX_SEQ"]
	return nil
}

// Fit answers o for m: the search, the boundary measured, and advice
// when nothing fits. table receives the sweeps' trial tables.
func Fit(o Options, m *Model, lib fs.FS, table, stderr io.Writer) (*Report, error) {
	r, err := sessionFor(o, m, lib, o.GPU, table, stderr)
	if err != nil {
		return nil, err
	}
	defer r.close()
	if o.Out != "" {
		done, err := r.openOut(o.Out)
		if err != nil {
			return nil, usageErr("--out %v", err)
		}
		defer done()
	}
	rep := &Report{Model: m.Name, Title: m.Title, Source: sourceKind(m), GPU: o.GPU, Precision: o.Precision,
		Optimizer: o.Optimizer, Checkpoint: o.Checkpoint, Attention: o.Attention, Steps: Steps, Finetune: o.Finetune}
	if rep.Finetune == "" {
		rep.Finetune = FinetuneFull
	}
	if m.HF != nil && m.HF.IsMoE() {
		rep.Routing = o.Routing
	}
	if o.Inference {
		rep.Inference, rep.MaxNewTokens, rep.KVCache = true, o.MaxNewTokens, o.KVCache
		rep.Optimizer, rep.Steps = "", 0
	} else if o.GradAccum > 1 {
		rep.GradAccum = o.GradAccum
	}
	if o.Parallel != "" {
		rep.GPUs, rep.Parallel = o.GPUs, o.Parallel
	}
	if m.Entry != nil {
		rep.PublishedParameters = m.Entry.Published
	}
	if err := r.starChecks(m, rep); err != nil {
		return nil, err
	}
	info, err := r.describe()
	if err != nil && (o.Finetune == FinetuneLoRA || o.Finetune == FinetuneQLoRA) && strings.Contains(err.Error(), "not found in the base model") {
		// no target matched (nn.lora fails, as get_peft_model does): say
		// which modules the model has, from the model without adapters
		ob := o
		ob.Finetune = FinetuneFull
		if base, berr := describeUnbounded(ob, m, lib, stderr); berr == nil {
			if uerr := checkLoRATargets(o, m, base); uerr != nil {
				return nil, uerr
			}
		}
		return nil, err
	}
	buildOOM := err != nil && backend.IsOOM(err)
	if buildOOM {
		// The weights alone are more than the card: count them on a card
		// with room, and let the search's trials (each an OOM at build)
		// and the advice say what would fit.
		info, err = describeUnbounded(o, m, lib, stderr)
		if err == nil {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the model's weights alone (%s) are more than the card's memory: building it runs out of memory", backend.FormatBytes(info.ParamBytes+info.QuantBytes)))
		}
	}
	if err != nil {
		return nil, err
	}
	rep.Parameters, rep.TrainableParameters, rep.ParameterDType = info.Parameters, info.Trainable, info.DType
	if o.Finetune == FinetuneLoRA || o.Finetune == FinetuneQLoRA {
		if err := checkLoRATargets(o, m, info); err != nil {
			return nil, err
		}
		st := floorOf(o, info, 0)
		rep.LoRA = &LoRAInfo{R: o.LoRAR, Alpha: o.LoRAAlpha, Dropout: o.LoRADropout, Targets: o.loraTargets, Modules: info.AdapterModules, Parameters: info.Adapters,
			GradientBytes: st.Gradients, OptimizerStateBytes: st.OptimizerState}
		if o.Finetune == FinetuneQLoRA {
			rep.LoRA.Quantization, rep.LoRA.ComputeDType, rep.LoRA.QuantBytes = "nf4", qloraDType(o.Precision), info.QuantBytes
		}
	}
	if m.Kind == KindStar && rep.PublishedParameters > 0 && rep.PublishedParameters != rep.Parameters {
		return nil, fmt.Errorf("%s: PARAMETERS is %s, but the model build() returns has %s parameters", m.Star, commas(rep.PublishedParameters), commas(rep.Parameters))
	}
	if m.HF != nil && m.HF.Path != "" {
		if err := checkpointBeside(m, info, rep); err != nil {
			return nil, err
		}
	}
	if m.HF != nil && m.HF.HasVision {
		rep.Notes = append(rep.Notes, "a multimodal config: memsh builds its text model only (the vision tower is not modelled)")
	}
	if dev := r.s.Devices(); len(dev) > 0 {
		rep.Device = dev[0].Description()
	}
	seq := 0
	if m.Sequence {
		seq = m.DefaultSeq
		if o.Seq > 0 {
			seq = o.Seq
		}
	}
	probe := seq
	if o.Set["batch"] {
		// the sequence search's long sequences (a sliding window's mask
		// comes in past its window)
		probe = min(m.MaxSeq, 16384)
	}
	if err := r.attentionReport(m, rep, probe); err != nil {
		return nil, err
	}
	var sr *Search
	if o.Set["batch"] {
		if !m.Sequence {
			return nil, usageErr("--batch: %s takes no sequence", m.Name)
		}
		rep.Search, rep.Batch = "seq", o.Batch
		sr, err = r.search("seq", o.Batch, 0, 1, m.MaxSeq, fmt.Sprintf("%s seq (batch %d)", m.Name, o.Batch))
	} else {
		rep.Search, rep.Seq = "batch", seq
		name := m.Name + " batch"
		if seq > 0 {
			name = fmt.Sprintf("%s batch (seq %d)", m.Name, seq)
		}
		sr, err = r.search("batch", 0, seq, 1, 0, name)
	}
	if err != nil {
		return nil, err
	}
	rep.Trials = sr.Trials
	for _, t := range sr.Trials {
		if t.Status == "oom" && t.Value < sr.Largest {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the sizes that train are not an interval: %d ran out of memory, %d trains (the caching allocator's blocks fall otherwise); another search may end at another boundary", t.Value, sr.Largest))
			break
		}
	}
	if sr.Largest > 0 {
		v := sr.Largest
		if sr.What == "seq" {
			rep.LargestSeq = &v
		} else {
			rep.LargestBatch = &v
		}
	}
	if sr.FirstOOM > 0 {
		v := sr.FirstOOM
		rep.FirstOOM = &v
	}
	at := func(n int) (int, int) {
		if sr.What == "seq" {
			return o.Batch, n
		}
		return n, seq
	}
	if sr.Largest > 0 {
		ms, err := r.measure(at(sr.Largest))
		if err != nil {
			return nil, err
		}
		rep.Capacity, rep.Usable, rep.Context = ms.Total, ms.Total-ms.Outside, ms.Outside
		rep.Peak = &Peak{Allocated: ms.MaxAllocated, Reserved: ms.MaxReserved, Fragmentation: ms.MaxReserved - ms.MaxAllocated, Headroom: ms.Total - ms.Outside - ms.MaxReserved}
		if o.Parallel == ParallelFSDPOffload {
			rep.Peak.Host = ms.HostPeak
		}
		rep.Breakdown = breakdownOf(ms.Peak)
		if rep.Breakdown != nil && !o.Inference {
			rep.Breakdown.OptimizerStatePaged = ms.Paged
		}
		rep.PeakPhase = ms.Phase
		if o.Inference && ms.Generation != nil {
			rep.PrefillPeak, rep.PeakIn = ms.Generation["prefill_peak"], ms.GenPhase
			kv := ms.Generation["kv_cache"]
			if o.KVCache == "dynamic" && ms.GenPhase == "prefill" {
				// at the prefill's peak the cache holds the prompt's tokens
				b, s := at(sr.Largest)
				kv = kv * int64(s) / int64(s+o.MaxNewTokens-1)
				_ = b
			}
			rep.Breakdown.KVCache = kv
			rep.Breakdown.Temporaries = max(0, rep.Breakdown.Temporaries-kv)
			rep.PeakPhase = ""
		}
		if ms.Status != "ok" {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the measuring trial at %d did not run (%s): its figures are of a run that failed", sr.Largest, ms.Status))
		}
	}
	if sr.FirstOOM > 0 {
		ms, err := r.measure(at(sr.FirstOOM))
		if err != nil {
			return nil, err
		}
		if rep.Capacity == 0 {
			rep.Capacity, rep.Usable, rep.Context = ms.Total, ms.Total-ms.Outside, ms.Outside
		}
		oi := &OOMInfo{Value: sr.FirstOOM, Requested: ms.Requested, Breakdown: breakdownOf(ms.Failed), Phase: ms.Phase, Message: ms.Error}
		if ms.Failed != nil {
			oi.Allocated = ms.Failed["Total"]
		}
		if buildOOM {
			// the weights ran out while the model was being built: none
			// of them a parameter yet, no phase
			oi.Building, oi.Breakdown, oi.Phase = true, nil, ""
		}
		rep.OOM = oi
		if ms.Status == "ok" {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the measuring trial at %d ran (the search's trial did not)", sr.FirstOOM))
		}
	}
	if sr.Largest == 0 && o.Inference {
		rep.Floor = &Floor{Parameters: info.ParamBytes, Total: info.ParamBytes, Usable: rep.Usable}
		adv, err := adviseInference(o, m, lib, seq, stderr)
		if err != nil {
			return nil, err
		}
		rep.Advice = adv
	} else if sr.Largest == 0 {
		rep.Floor = floorOf(o, info, rep.Usable)
		adv, err := advise(o, m, lib, seq, info, stderr)
		if err != nil {
			return nil, err
		}
		rep.Advice = adv
	}
	return rep, nil
}

// qloraDType is QLoRA's checkpoint dtype and compute dtype for a
// precision (driver.star's QDTYPE).
func qloraDType(p string) string {
	switch p {
	case PrecFP16:
		return "float16"
	case PrecFP32:
		return "float32"
	}
	return "bfloat16"
}

// checkLoRATargets checks --lora-targets against the built model's
// modules (a name matches a module whose dotted name is it or ends with
// "." + it, as PEFT matches): a name that matches none is a usage error
// listing the model's linear layers' names.
func checkLoRATargets(o Options, m *Model, info *modelInfo) error {
	if len(o.loraTargets) == 1 && o.loraTargets[0] == "all-linear" {
		return nil
	}
	mods := map[string]bool{}
	var names []string // the last components of the weights' modules
	for _, p := range info.Params {
		if !strings.HasSuffix(p.Name, ".weight") || len(p.Shape) != 2 {
			continue
		}
		mod := strings.TrimSuffix(p.Name, ".weight")
		mods[mod] = true
		last := mod[strings.LastIndex(mod, ".")+1:]
		if !slices.Contains(names, last) {
			names = append(names, last)
		}
	}
	for _, t := range o.loraTargets {
		found := false
		for mod := range mods {
			if mod == t || strings.HasSuffix(mod, "."+t) {
				found = true
				break
			}
		}
		if !found {
			what := "--lora-targets"
			if !o.Set["lora-targets"] {
				what = "the default LoRA targets"
			}
			return usageErr("%s: no module %q in %s (its 2-D weights' modules: %s)", what, t, m.Name, strings.Join(names, ", "))
		}
	}
	return nil
}

func sourceKind(m *Model) string {
	switch {
	case m.Kind == KindStar:
		return "star"
	case m.Entry != nil:
		return "library"
	}
	return "config"
}

// starChecks reads a .star model's PARAMETERS and MAX_SEQ once loaded.
func (r *run) starChecks(m *Model, rep *Report) error {
	if m.Kind != KindStar {
		return nil
	}
	if v := r.s.Get("MAX_SEQ"); v != nil {
		n := toInt(v)
		if n < 1 {
			return usageErr("%s: MAX_SEQ must be a positive int, got %s", m.Star, v)
		}
		m.MaxSeq = n
		m.DefaultSeq = min(n, DefaultSeqCap)
		if r.o.Seq > n {
			return usageErr("--seq %d: %s takes at most %d (MAX_SEQ)", r.o.Seq, m.Star, n)
		}
	} else if r.o.Set["seq"] || r.o.Set["batch"] {
		return usageErr("--seq/--batch: %s defines no MAX_SEQ, so it is not a sequence model", m.Star)
	}
	if v := r.s.Get("PARAMETERS"); v != nil {
		rep.PublishedParameters = int64(toInt(v))
	}
	return nil
}

// attentionReport fills what attention runs and, for SDPA, its backend.
func (r *run) attentionReport(m *Model, rep *Report, seq int) error {
	switch m.Kind {
	case KindResNet:
		rep.Attention = ""
		return nil
	case KindStar:
		rep.Attention = "the model file's"
		return nil
	}
	if m.HF != nil {
		v, err := r.eval("E = needs_eager(SPEC[\"config\"], SPEC[\"attention\"])\n", "E")
		if err != nil {
			return err
		}
		if why := toStr(v); why != "" {
			rep.Attention, rep.AttentionNote = "eager", why
			return nil
		}
	}
	if rep.Attention == "eager" {
		return nil
	}
	be, err := r.attention(seq)
	if err != nil {
		return err
	}
	rep.SDPABackend = be
	return nil
}

// checkpointBeside checks model.safetensors (or its index) beside a
// config.json against the built model.
func checkpointBeside(m *Model, info *modelInfo, rep *Report) error {
	dir := filepath.Dir(m.HF.Path)
	tensors, ok, err := ReadCheckpointHeaders(dir)
	if err != nil {
		return usageErr("%v", err)
	}
	if !ok {
		return nil
	}
	n, err := CheckCheckpoint(tensors, info.Params, m.HF.TorchDType, nil)
	if err != nil {
		return usageErr("%s: %v", dir, err)
	}
	rep.CheckpointFile = &CheckpointCheck{Tensors: n, DType: m.HF.TorchDType}
	return nil
}

// floorOf is the model state: the weights (with a 4-bit base's
// quantization states), the trainable parameters' gradients and the
// optimizer's state for them, each rounded as the allocator rounds.
func floorOf(o Options, info *modelInfo, usable int64) *Floor {
	if o.Parallel == ParallelZeRO3 {
		return zero3Floor(o, info, usable)
	}
	if o.zero() {
		return zeroFloor(o, info, usable)
	}
	info = rankInfo(o, info)
	if o.Parallel == ParallelFSDPOffload {
		return offloadFloor(o, info, usable)
	}
	dev, paged := optimizerStateBytes(o.Optimizer, info)
	f := &Floor{Parameters: info.ParamBytes + info.QuantBytes, Gradients: info.TrainableBytes, OptimizerState: dev, OptimizerStatePaged: paged, Usable: usable}
	if o.Parallel == ParallelDDP {
		// the reducer's buckets: another copy of the trainable parameters
		f.Communication = info.TrainableBytes
	}
	return f.summed()
}

// offloadFloor is rank 0's model state under FSDP2 with CPU offload
// (info: rank 0's shards): nothing on the device; in host memory the
// padded shards, their gradients and the optimizer's state for them
// (AdamW and Adam: two moments; SGD with momentum 0: none), as the host
// allocator counts them (no rounding).
func offloadFloor(o Options, info *modelInfo, usable int64) *Floor {
	elem := int64(elemOf(info))
	n := int64(max(1, o.GPUs))
	var params, trainable int64
	for _, p := range info.Params {
		if len(p.Shape) == 0 {
			params++
			continue
		}
		params += (int64(p.Shape[0]) + n - 1) / n * int64(numelOf(p.Shape[1:]))
	}
	for _, s := range info.TrainableShapes { // already rank 0's rows
		trainable += int64(numelOf(s))
	}
	if info.Adapters > 0 {
		params += trainable // LoRA's adapters are not among Params
	}
	states := int64(2)
	if o.Optimizer == OptSGD {
		states = 0
	}
	f := &Floor{Usable: usable, Offloaded: (params + trainable*(1+states)) * elem}
	return f.summed()
}

// elemOf is the bytes of an element of the model's dtype.
func elemOf(info *modelInfo) uint64 {
	if strings.Contains(info.DType, "16") {
		return 2
	}
	return 4
}

// deepSpeedElem is the bytes of an element of DeepSpeed's model dtype:
// bfloat16 with its bf16 enabled (--precision bf16), else float32.
func deepSpeedElem(o Options) int64 {
	if o.Precision == PrecBF16 {
		return 2
	}
	return 4
}

// summed sets the floor's Total: its parts' sum.
func (f *Floor) summed() *Floor {
	f.Total = f.Parameters + f.Gradients + f.OptimizerState + f.Communication
	return f
}

// zeroFloor is rank 0's model state under DeepSpeed's ZeRO-1/2: every
// parameter in the model dtype (bfloat16 with bf16, the flat buffer of
// the trainable ones rounded up to 2N elements), the fp32 master and
// Adam's two moments of the 1/N partition (12 bytes an element), and the
// gradients the backward leaves: this rank's partition (stage 2, about
// 1/N of them) or all of them until the backward ends (stage 1).
func zeroFloor(o Options, info *modelInfo, usable int64) *Floor {
	elem := deepSpeedElem(o)
	n := int64(max(1, o.GPUs))
	psi := info.Trainable
	a := (psi + 2*n - 1) / (2 * n) * (2 * n)
	f := &Floor{Parameters: (info.Parameters-psi)*elem + a*elem, OptimizerState: 12 * a / n, Usable: usable}
	f.Gradients = a * elem / n
	if o.Parallel == ParallelZeRO1 {
		f.Gradients = psi * elem
	}
	return f.summed()
}

// zero3Floor is rank 0's model state under DeepSpeed's ZeRO-3: per
// parameter its partition, ceil(n/N) elements, in the model dtype
// (bfloat16 with bf16); of the trainable ones also the gradient
// partition (the same), the fp32 master and Adam's two moments (12 bytes
// an element); the reduce bucket (reduce_bucket_size elements, always
// there: communication); and the persistent parameters (at most
// stage3_param_persistence_threshold elements) gathered whole, ceil(n/N)·N
// elements each, from the first step on.
func zero3Floor(o Options, info *modelInfo, usable int64) *Floor {
	elem := deepSpeedElem(o)
	n := int64(max(1, o.GPUs))
	part := func(shape []int) int64 { return (int64(numelOf(shape)) + n - 1) / n }
	var all, persist int64
	for _, p := range info.Params {
		c := part(p.Shape)
		all += c
		if int64(numelOf(p.Shape)) <= tdist.DefaultParamPersistenceThreshold {
			persist += c * n
		}
	}
	var trainable int64
	for _, s := range info.TrainableShapes {
		trainable += part(s)
	}
	f := &Floor{Parameters: (all + persist) * elem, Gradients: trainable * elem, OptimizerState: 12 * trainable,
		Communication: tdist.DefaultReduceBucketSize * elem, Usable: usable}
	return f.summed()
}

// rankInfo is info as rank 0 holds it: tensor parallelism's chunks
// (info.Rank), FSDP2's dim-0 shards of them over the data-parallel
// ranks.
func rankInfo(o Options, info *modelInfo) *modelInfo {
	if o.TP > 0 && info.Rank != nil {
		info = info.Rank
	}
	switch {
	case o.fsdp():
		return shardedInfo(info, o.GPUs)
	case o.TPFSDP:
		return shardedInfo(info, o.GPUs/o.TP)
	}
	return info
}

// shardedInfo is info as rank 0 of an FSDP2 job of n ranks holds it: each
// parameter's padded dim-0 shard, ceil(d0/n) rows (rank 0's are all
// real), so the trainable shapes the optimizer's state follows are those
// rows.
func shardedInfo(info *modelInfo, n int) *modelInfo {
	elem := int64(elemOf(info))
	shard := func(shape []int) []int {
		if len(shape) == 0 {
			return shape
		}
		return append([]int{(shape[0] + n - 1) / n}, shape[1:]...)
	}
	bytes := func(shape []int) int64 { return int64(roundBlock(numelOf(shape) * uint64(elem))) }
	s := *info
	s.ParamBytes, s.TrainableBytes, s.TrainableShapes = 0, 0, nil
	for _, p := range info.Params {
		s.ParamBytes += bytes(shard(p.Shape))
	}
	for _, sh := range info.TrainableShapes {
		sh = shard(sh)
		s.TrainableShapes = append(s.TrainableShapes, sh)
		s.TrainableBytes += bytes(sh)
	}
	if info.Adapters > 0 {
		// LoRA's adapters are not among Params: their shards are the
		// trainable ones
		s.ParamBytes += s.TrainableBytes
	}
	return &s
}

// roundBlock is the caching allocator's rounding of a request (512-byte
// blocks).
func roundBlock(n uint64) uint64 { return (n + 511) / 512 * 512 }

// optimizerStateBytes is the state optimizer name keeps for the model's
// parameters after its first step, by the closed forms of tensor/optim:
// on the device, and in bitsandbytes' paged memory. AdamW and Adam: two
// moments of the parameter's dtype (fused: and a 0-dim float32 step per
// parameter); the 8-bit AdamWs: Adam8bitStateBytes and the two [256]
// float32 maps; Adafactor: HFAdafactorStateBytes and the 0-dim RMS per
// parameter; SGD with momentum 0: nothing. Only trainable parameters
// (LoRA's adapters, not a frozen base) have state.
func optimizerStateBytes(name string, info *modelInfo) (device, paged int64) {
	n := int64(len(info.TrainableShapes))
	switch name {
	case OptSGD:
		return 0, 0
	case OptAdamWFused:
		return 2*info.TrainableBytes + n*512, 0
	case OptAdamW8bit, OptPagedAdamW8bit:
		var d, pg uint64
		maps := false
		for _, shape := range info.TrainableShapes {
			numel := numelOf(shape)
			dd, pp := optim.Adam8bitStateBytes(numel, optim.Default8bitMinSize, name == OptPagedAdamW8bit, roundBlock)
			d += dd
			pg += pp
			maps = maps || numel >= optim.Default8bitMinSize
		}
		if maps {
			d += 2 * roundBlock(256*4)
		}
		return int64(d), int64(pg)
	case OptAdafactor:
		var d uint64
		for _, shape := range info.TrainableShapes {
			d += optim.HFAdafactorStateBytes(shape, false, roundBlock) + 512
		}
		return int64(d), 0
	}
	return 2 * info.TrainableBytes, 0
}

func numelOf(shape []int) uint64 {
	n := uint64(1)
	for _, s := range shape {
		n *= uint64(s)
	}
	return n
}

// unboundedGPU is a meta card with room for any model's weights, for
// counting parameters when the requested card cannot hold them.
const unboundedGPU = "1PiB"

// describeUnbounded builds m on unboundedGPU and returns its parameters.
func describeUnbounded(o Options, m *Model, lib fs.FS, stderr io.Writer) (*modelInfo, error) {
	r, err := sessionFor(o, m, lib, unboundedGPU, io.Discard, stderr)
	if err != nil {
		return nil, err
	}
	defer r.close()
	return r.describe()
}
