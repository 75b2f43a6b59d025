package fit

import (
	"fmt"
	"io"
	"io/fs"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/memsh/memsh/backend/sim"
)

// attempt is one search of the advice: the options with one change (and
// the card), searched in a Session of its own.
type attempt struct {
	change string
	o      Options
	gpu    string
	what   string                        // "batch" or "seq": the Alternative's What
	search func(r *run) (*Search, error) // the search in the attempt's Session

	a   Alternative // the result
	err error
}

// adviceWorkers bounds the searches searchAll runs at once (0:
// GOMAXPROCS); tests set it.
var adviceWorkers = 0

// searchAll runs the attempts' searches, up to GOMAXPROCS at once: each
// has a Session of its own and Sessions share no state (TestConcurrentBackward
// and the race detector check that their training steps do not), so the
// answers are those of running them one after another, in less time on
// more cores. stderr is shared, behind a lock.
func searchAll(as []*attempt, m *Model, lib fs.FS, stderr io.Writer) error {
	errw := &lockedWriter{w: stderr}
	n := adviceWorkers
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, at := range as {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			at.a = Alternative{Change: at.change, Modelled: true, What: at.what}
			r, err := sessionFor(at.o, m, lib, at.gpu, io.Discard, errw)
			if err != nil {
				at.err = err
				return
			}
			defer r.close()
			sr, err := at.search(r)
			if err != nil {
				at.err = err
				return
			}
			at.a.Fits, at.a.Largest, at.a.FirstOOM = sr.Largest > 0, sr.Largest, sr.FirstOOM
		}()
	}
	wg.Wait()
	for _, at := range as {
		if at.err != nil {
			return at.err
		}
	}
	return nil
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// advise tries the changes that could make the model fit, each by a
// search of its own (a first trial at the smallest size that does not
// fit ends it at once). The searches that depend on no other's answer run
// at once (searchAll); then those that do: the paged 8-bit optimizer when
// the unpaged one does not fit, the bigger cards after the smallest, the
// combination when nothing fits. The alternatives are listed in one fixed
// order.
func advise(o Options, m *Model, lib fs.FS, seq int, info *modelInfo, stderr io.Writer) ([]Alternative, error) {
	info = rankInfo(o, info) // the optimizers' state per rank
	zero := o.zero()
	batchSearch := func(change string, o2 Options, gpu string) *attempt {
		at := &attempt{change: change, o: o2, gpu: gpu, what: "batch"}
		if o2.Set["batch"] {
			at.what = "seq"
			at.search = func(r *run) (*Search, error) { return r.search("seq", o2.Batch, 0, 1, m.MaxSeq, change) }
		} else {
			s := 0
			if m.Sequence {
				s = seq
			}
			at.search = func(r *run) (*Search, error) { return r.search("batch", 0, s, 1, 0, change) }
		}
		return at
	}
	var first []*attempt // wave 1, in the listing's order
	var ckpt, shorter, precision, lora, qlora *attempt
	if !o.Checkpoint {
		o2 := o
		o2.Checkpoint = true
		ckpt = batchSearch("activation checkpointing", o2, o.GPU)
		first = append(first, ckpt)
	}
	if m.Sequence && !o.Set["batch"] && seq > 1 {
		// the longest sequence at batch 1
		o2 := o
		o2.Set = map[string]bool{"batch": true}
		for k, v := range o.Set {
			o2.Set[k] = v
		}
		o2.Batch = 1
		shorter = batchSearch(fmt.Sprintf("a shorter sequence than %d (at batch 1)", seq), o2, o.GPU)
		first = append(first, shorter)
	}
	// the optimizers that keep less state on the device than o's; the
	// paged one counts only when the unpaged 8-bit one does not fit
	cur, _ := optimizerStateBytes(o.Optimizer, info)
	type optTry struct {
		at   *attempt
		note string
	}
	var opts []optTry
	var eightBit, paged *attempt
	for _, opt := range Optimizers {
		dev, _ := optimizerStateBytes(opt.Name, info)
		if !opt.Saver || opt.Name == o.Optimizer || dev >= cur || zero || o.Parallel == ParallelFSDPOffload {
			continue // (DeepSpeed's engine: FusedAdam only; CPU offload: no state on the device)
		}
		o2 := o
		o2.Optimizer = opt.Name
		at := batchSearch("optimizer "+opt.Name, o2, o.GPU)
		opts = append(opts, optTry{at, "optimizer state " + fb(dev) + " instead of " + fb(cur)})
		switch opt.Name {
		case OptAdamW8bit:
			eightBit = at
		case OptPagedAdamW8bit:
			paged = at
		}
		if opt.Name != OptPagedAdamW8bit || eightBit == nil {
			first = append(first, at)
		}
	}
	if lower := lowerPrecision(o.Precision); lower != "" && !(zero && lower == PrecBF16True) {
		o2 := o
		o2.Precision = lower
		precision = batchSearch("precision "+precisionText(lower), o2, o.GPU)
		first = append(first, precision)
	}
	bigger := biggerPresets(o.GPU)
	var cards []*attempt
	for _, p := range bigger {
		cards = append(cards, batchSearch("a bigger card: "+p.Key+" ("+fb(int64(p.Total))+")", o, p.Key))
	}
	if len(cards) > 0 {
		first = append(first, cards[0])
	}
	for _, ft := range []string{FinetuneLoRA, FinetuneQLoRA} {
		o2, change, ok := finetuneAlternative(o, m, ft)
		if !ok {
			continue
		}
		at := batchSearch(change, o2, o.GPU)
		if ft == FinetuneLoRA {
			lora = at
		} else {
			qlora = at
		}
		first = append(first, at)
	}
	// sharding: FSDP2 on 4 GPUs, then on 2 when 4 fit, else on 8
	shardOn := func(n int) *attempt {
		o2 := o
		o2.GPUs, o2.Parallel = n, ParallelFSDP
		o2.Set = map[string]bool{"gpus": true, "parallel": true}
		for k, v := range o.Set {
			o2.Set[k] = v
		}
		return batchSearch(fmt.Sprintf("FSDP2 on %s (--gpus %d --parallel fsdp)", gpusText(n, o.GPU), n), o2, o.GPU)
	}
	var fsdp4, fsdpNext, offload *attempt
	var offloadNote string
	canShard := !o.fsdp() && o.TP == 0 && o.Precision != PrecFP16 && o.Finetune != FinetuneQLoRA
	if canShard {
		fsdp4 = shardOn(4)
		first = append(first, fsdp4)
	}
	if canShard && (o.Optimizer == OptAdamWTorch || o.Optimizer == OptAdam || o.Optimizer == OptSGD) {
		// the model state in host memory, on the GPUs the job has
		o2 := o
		o2.GPUs, o2.Parallel = max(1, o.GPUs), ParallelFSDPOffload
		o2.Set = map[string]bool{"gpus": true, "parallel": true}
		for k, v := range o.Set {
			o2.Set[k] = v
		}
		offload = batchSearch(fmt.Sprintf("FSDP2 with CPU offload on %s (--gpus %d --parallel fsdp,offload)", gpusText(o2.GPUs, o.GPU), o2.GPUs), o2, o.GPU)
		offloadNote = "per rank; its model state in pinned host memory: " + fb(floorOf(o2, info, 0).Offloaded)
		first = append(first, offload)
	}
	if err := searchAll(first, m, lib, stderr); err != nil {
		return nil, err
	}

	// wave 2: what depends on wave 1's answers
	var second []*attempt
	if paged != nil && eightBit != nil && eightBit.a.Fits {
		opts = slices.DeleteFunc(opts, func(t optTry) bool { return t.at == paged })
	} else if paged != nil && eightBit != nil {
		second = append(second, paged)
	}
	if len(cards) > 1 && !cards[0].a.Fits {
		second = append(second, cards[1:]...)
	}
	if fsdp4 != nil {
		if fsdp4.a.Fits {
			fsdpNext = shardOn(2)
		} else {
			fsdpNext = shardOn(8)
		}
		second = append(second, fsdpNext)
	}
	var out []Alternative
	add := func(at *attempt) {
		if at != nil {
			out = append(out, at.a)
		}
	}
	if err := searchAll(second, m, lib, stderr); err != nil {
		return nil, err
	}
	add(ckpt)
	if shorter != nil {
		if shorter.a.Largest >= seq {
			shorter.a.Fits = false
		}
		add(shorter)
	}
	for _, t := range opts {
		t.at.a.Note = t.note
		add(t.at)
	}
	add(precision)
	// the smallest bigger card that fits, or the biggest
	for i, c := range cards {
		if c.a.Fits || i == len(cards)-1 {
			add(c)
			break
		}
	}
	anyFits := false
	for _, a := range out {
		anyFits = anyFits || a.Fits
	}
	if !anyFits && !zero {
		o2 := o
		o2.Checkpoint = true
		o2.Optimizer = OptSGD
		if lower := lowerPrecision(o.Precision); lower != "" {
			o2.Precision = PrecBF16True
		}
		all := batchSearch("all of checkpointing, SGD and bf16-true", o2, o.GPU)
		if err := searchAll([]*attempt{all}, m, lib, stderr); err != nil {
			return nil, err
		}
		add(all)
	}
	add(lora)
	add(qlora)
	if offload != nil {
		offload.a.Note = offloadNote
		add(offload)
	}
	// the fewest GPUs that fit (2 before 4), or 8's answer
	switch {
	case fsdp4 == nil:
	case fsdpNext.a.Fits || !fsdp4.a.Fits:
		fsdpNext.a.Note = "per rank"
		add(fsdpNext)
	default:
		fsdp4.a.Note = "per rank"
		add(fsdp4)
	}
	return out, nil
}

// gpusText is "N × CARD".
func gpusText(n int, card string) string { return fmt.Sprintf("%d × %s", n, card) }

// finetuneAlternative is o with --finetune ft, when that is a change the
// model takes (LoRA after full fine-tuning, QLoRA after full or LoRA):
// the user's LoRA settings, else PEFT's defaults (r 8, alpha 8, the model
// type's targets, all-linear for a type PEFT has none for); QLoRA with
// activation checkpointing, as prepare_model_for_kbit_training turns it
// on by default.
func finetuneAlternative(o Options, m *Model, ft string) (Options, string, bool) {
	rank := map[string]int{FinetuneFull: 0, "": 0, FinetuneLoRA: 1, FinetuneQLoRA: 2}
	if rank[ft] <= rank[o.Finetune] || (ft == FinetuneQLoRA && o.Parallel != "" && o.Parallel != ParallelDDP) || o.TP > 0 {
		// (tensor parallelism of PEFT's layers is not modelled)
		return o, "", false
	}
	o2 := o
	o2.Finetune = ft
	o2.Set = map[string]bool{}
	for k, v := range o.Set {
		o2.Set[k] = v
	}
	if err := o2.validateFinetune(m); err != nil {
		if IsUsage(err) && strings.HasPrefix(err.Error(), "--lora-targets") {
			o2.LoRATargets = "all-linear"
			err = o2.validateFinetune(m)
		}
		if err != nil {
			return o, "", false
		}
	}
	change := fmt.Sprintf("LoRA r=%d on %s", o2.LoRAR, strings.Join(o2.loraTargets, ", "))
	if ft == FinetuneQLoRA {
		change = "Q" + change
		if !o.Checkpoint {
			// prepare_model_for_kbit_training's default,
			// use_gradient_checkpointing=True: QLoRA's recipe
			o2.Checkpoint = true
			change += " with checkpointing"
		}
	}
	return o2, change, true
}

// adviseInference tries what could make generation fit: the other KV
// cache, a shorter prompt, fewer new tokens, a bigger card (as advise,
// the independent searches at once).
func adviseInference(o Options, m *Model, lib fs.FS, seq int, stderr io.Writer) ([]Alternative, error) {
	mk := func(change string, o2 Options, gpu string, what string) *attempt {
		at := &attempt{change: change, o: o2, gpu: gpu, what: what}
		if what == "seq" {
			at.search = func(r *run) (*Search, error) { return r.search("seq", 1, 0, 1, m.MaxSeq-o2.MaxNewTokens, change) }
		} else {
			at.search = func(r *run) (*Search, error) { return r.search("batch", 0, seq, 1, 0, change) }
		}
		return at
	}
	other := "static"
	if o.KVCache == "static" {
		other = "dynamic"
	}
	o2 := o
	o2.KVCache = other
	first := []*attempt{mk("a "+cacheText(other)+" instead", o2, o.GPU, "batch")}
	if seq > 1 {
		first = append(first, mk(fmt.Sprintf("a shorter prompt than %d (at batch 1)", seq), o, o.GPU, "seq"))
	}
	var cards []*attempt
	for _, p := range biggerPresets(o.GPU) {
		cards = append(cards, mk("a bigger card: "+p.Key+" ("+fb(int64(p.Total))+")", o, p.Key, "batch"))
	}
	if len(cards) > 0 {
		first = append(first, cards[0])
	}
	if err := searchAll(first, m, lib, stderr); err != nil {
		return nil, err
	}
	if len(cards) > 1 && !cards[0].a.Fits {
		if err := searchAll(cards[1:], m, lib, stderr); err != nil {
			return nil, err
		}
	}
	var out []Alternative
	for _, at := range first[:len(first)-min(len(cards), 1)] {
		if at.what == "seq" && at.a.Largest >= seq {
			at.a.Fits = false
		}
		out = append(out, at.a)
	}
	if len(cards) > 0 {
		found := false
		for _, c := range cards {
			if c.a.Fits {
				out = append(out, c.a)
				found = true
				break
			}
		}
		if !found {
			out = append(out, Alternative{Change: "a bigger card", Modelled: true, Note: "none of memsh's presets fits"})
		}
	}
	out = append(out,
		Alternative{Change: "8-bit or 4-bit weights (bitsandbytes)", Note: "an open issue of memsh's"},
		Alternative{Change: "tensor parallelism across N GPUs", Note: "an open issue of memsh's"})
	return out, nil
}

// lowerPrecision is the next precision that stores less: fp32 → bf16
// autocast, autocast → bf16-true.
func lowerPrecision(p string) string {
	switch p {
	case PrecFP32:
		return PrecBF16
	case PrecBF16, PrecFP16:
		return PrecBF16True
	}
	return ""
}

// biggerPresets are the presets with more memory than gpu, smallest first.
func biggerPresets(gpu string) []sim.Preset {
	var total uint64
	if p, ok := sim.LookupPreset(gpu); ok {
		total = p.Total
	} else if sp, err := sim.ParseSpec(gpu + ",meta"); err == nil {
		total = sp.Total
	}
	var out []sim.Preset
	for _, p := range sim.Presets() {
		if p.Total > total {
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Total < out[j].Total })
	return out
}
