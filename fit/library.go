package fit

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/agnivade/levenshtein"
)

// Kind is how a model is built.
type Kind string

// The kinds of model.
const (
	KindNanoGPT Kind = "nanogpt" // models/gpt2.star: GPT-2 in nanoGPT's layout (memsh's real-GPU checks)
	KindHF      Kind = "hf"      // models/hf.star from a config.json
	KindResNet  Kind = "resnet"  // models/resnet.star
	KindStar    Kind = "star"    // a user's .star model file
)

// Entry is a model of memsh's library.
type Entry struct {
	Name string
	Kind Kind
	// Config is the library file of its config.json (KindHF:
	// "models/configs/NAME.json"); Preset the builder's preset
	// (KindNanoGPT, KindResNet: "GPT2_SMALL").
	Config, Preset string
	// Published is the published parameter count, and Source where it
	// was published.
	Published int64
	Source    string
	// Title is how the report names it.
	Title string
}

// Library is memsh's model library, in the order `memsh fit --help` lists
// it. The Hugging Face models are their published config.json (kept in
// scripts/models/configs), built as transformers builds them; GPT-2 is
// nanoGPT's layout (dropout 0, a tied lm_head, its loss on the logits),
// the model memsh's boundaries were checked against on real H100s and
// H200s — a GPT-2 config.json builds transformers' GPT2LMHeadModel.
var Library = []Entry{
	{Name: "gpt2-small", Kind: KindNanoGPT, Preset: "GPT2_SMALL", Published: 124439808, Source: "Hugging Face openai-community/gpt2 (124,439,808)", Title: "GPT-2 small (nanoGPT layout)"},
	{Name: "gpt2-medium", Kind: KindNanoGPT, Preset: "GPT2_MEDIUM", Published: 354823168, Source: "Hugging Face openai-community/gpt2-medium", Title: "GPT-2 medium (nanoGPT layout)"},
	{Name: "gpt2-large", Kind: KindNanoGPT, Preset: "GPT2_LARGE", Published: 774030080, Source: "Hugging Face openai-community/gpt2-large", Title: "GPT-2 large (nanoGPT layout)"},
	{Name: "gpt2-xl", Kind: KindNanoGPT, Preset: "GPT2_XL", Published: 1557611200, Source: "Hugging Face openai-community/gpt2-xl", Title: "GPT-2 XL (nanoGPT layout)"},
	{Name: "llama-3.2-1b", Kind: KindHF, Config: "models/configs/llama-3.2-1b.json", Published: 1235814400, Source: "meta-llama/Llama-3.2-1B model card (1.23B), safetensors metadata 1,235,814,400", Title: "Llama 3.2 1B"},
	{Name: "llama-3.1-8b", Kind: KindHF, Config: "models/configs/llama-3.1-8b.json", Published: 8030261248, Source: "meta-llama/Llama-3.1-8B safetensors metadata (8,030,261,248)", Title: "Llama 3.1 8B"},
	{Name: "mistral-7b", Kind: KindHF, Config: "models/configs/mistral-7b-v0.1.json", Published: 7241732096, Source: "mistralai/Mistral-7B-v0.1 safetensors metadata (7,241,732,096)", Title: "Mistral 7B v0.1"},
	{Name: "qwen2.5-0.5b", Kind: KindHF, Config: "models/configs/qwen2.5-0.5b.json", Published: 494032768, Source: "Qwen/Qwen2.5-0.5B safetensors metadata (494,032,768)", Title: "Qwen2.5 0.5B"},
	{Name: "qwen3-0.6b", Kind: KindHF, Config: "models/configs/qwen3-0.6b.json", Published: 596049920, Source: "Qwen/Qwen3-0.6B safetensors metadata (596,049,920)", Title: "Qwen3 0.6B"},
	{Name: "gemma-2-2b", Kind: KindHF, Config: "models/configs/gemma-2-2b.json", Published: 2614341888, Source: "google/gemma-2-2b safetensors metadata (2,614,341,888)", Title: "Gemma 2 2B"},
	{Name: "gemma-3-1b", Kind: KindHF, Config: "models/configs/gemma-3-1b.json", Published: 999885952, Source: "google/gemma-3-1b-pt safetensors metadata (999,885,952)", Title: "Gemma 3 1B"},
	{Name: "phi-3-mini", Kind: KindHF, Config: "models/configs/phi-3-mini-4k.json", Published: 3821079552, Source: "microsoft/Phi-3-mini-4k-instruct safetensors metadata (3,821,079,552)", Title: "Phi-3 mini (4k)"},
	{Name: "resnet18", Kind: KindResNet, Preset: "RESNET18", Published: 11689512, Source: "torchvision resnet18 (11,689,512)", Title: "ResNet-18"},
	{Name: "resnet50", Kind: KindResNet, Preset: "RESNET50", Published: 25557032, Source: "torchvision resnet50 (25,557,032)", Title: "ResNet-50"},
}

// LookupLibrary finds a library model by name, ignoring case.
func LookupLibrary(name string) (Entry, bool) {
	for _, e := range Library {
		if strings.EqualFold(e.Name, name) {
			return e, true
		}
	}
	return Entry{}, false
}

// LibraryNames lists the library's names.
func LibraryNames() []string {
	out := make([]string, len(Library))
	for i, e := range Library {
		out[i] = e.Name
	}
	return out
}

// didYouMean returns the candidates closest to s (edit distance at most
// a third of its length, at least 2), best first.
func didYouMean(s string, candidates []string) []string {
	type scored struct {
		name string
		d    int
	}
	var best []scored
	limit := max(2, len(s)/3)
	for _, c := range candidates {
		d := levenshtein.ComputeDistance(strings.ToLower(s), strings.ToLower(c))
		if strings.HasPrefix(strings.ToLower(c), strings.ToLower(s)) && len(s) >= 3 {
			d = min(d, 1)
		}
		if d <= limit {
			best = append(best, scored{c, d})
		}
	}
	sort.SliceStable(best, func(i, j int) bool { return best[i].d < best[j].d })
	var out []string
	for _, b := range best {
		if len(out) < 3 && !slices.Contains(out, b.name) && b.d <= best[0].d+1 {
			out = append(out, b.name)
		}
	}
	return out
}

// unknownModel is the one-line error for a SOURCE that is neither a file
// nor a library name.
func unknownModel(src string) error {
	msg := fmt.Sprintf("unknown model %q", src)
	if dym := didYouMean(src, LibraryNames()); len(dym) > 0 {
		msg += fmt.Sprintf(" (did you mean %s?)", quoteList(dym))
	} else {
		msg += fmt.Sprintf(" (library: %s)", strings.Join(LibraryNames(), " "))
	}
	return usageErr("%s; a model is a library name, a config.json or its directory, or a .star model file", msg)
}

func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	switch len(q) {
	case 1:
		return q[0]
	case 2:
		return q[0] + " or " + q[1]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
