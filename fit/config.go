package fit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// HFModelTypes are the config.json model_types memsh builds
// (scripts/models/hf.star's FAMILIES and BUILDERS; TestModelTypesMatchLibrary
// keeps the two lists equal).
var HFModelTypes = []string{"gemma2", "gemma3", "gemma3_text", "gpt2", "llama", "mistral", "mixtral", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}

// MoEModelTypes are the HFModelTypes whose models have
// Mixture-of-Experts layers (models/moe.star), routed by --routing.
var MoEModelTypes = []string{"mixtral", "qwen2_moe", "qwen3_moe"}

// IsMoE reports whether the config's model has Mixture-of-Experts layers.
func (c *HFConfig) IsMoE() bool { return slices.Contains(MoEModelTypes, c.ModelType) }

// HFConfig is what fit reads of a Hugging Face config.json before any
// Starlark runs; the model itself is built from Raw by models/hf.star.
type HFConfig struct {
	Path      string // the file ("" for a library config)
	Raw       []byte // the file's bytes
	ModelType string // model_type (a nested text_config's for gemma3)
	// MaxPositions is max_position_embeddings (n_positions for GPT-2): the
	// longest sequence; 0 when the config has none.
	MaxPositions int
	TorchDType   string // torch_dtype ("bfloat16"; "" when absent)
	Vocab        int
	HasVision    bool // a multimodal config whose vision tower memsh leaves out
}

// ReadHFConfig reads a config.json (or the config.json in a directory).
func ReadHFConfig(path string) (*HFConfig, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, usageErr("%s: %v", path, unwrapPath(err))
	}
	if fi.IsDir() {
		p := filepath.Join(path, "config.json")
		if _, err := os.Stat(p); err != nil {
			return nil, usageErr("%s: a directory without config.json", path)
		}
		path = p
	} else if !fi.Mode().IsRegular() {
		return nil, usageErr("%s: not a regular file", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usageErr("%s: %v", path, unwrapPath(err))
	}
	c, err := ParseHFConfig(data)
	if err != nil {
		return nil, usageErr("%s: %v", path, err)
	}
	c.Path = path
	return c, nil
}

// ParseHFConfig reads config.json's bytes. An unknown model_type is an
// error naming the supported ones and the .star route.
func ParseHFConfig(data []byte) (*HFConfig, error) {
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("not a JSON config: %v", err)
	}
	c := &HFConfig{Raw: data}
	mt, _ := m["model_type"].(string)
	text := m
	if t, ok := m["text_config"].(map[string]any); ok {
		text = t
		c.HasVision = m["vision_config"] != nil
	}
	if mt == "" {
		return nil, errors.New("no model_type: not a Hugging Face model config")
	}
	c.ModelType = mt
	if !supportedType(mt) {
		return nil, fmt.Errorf("model_type %q is not one memsh builds (%s); write the model as a .star file (build, inputs: docs/fit.md) instead", mt, strings.Join(HFModelTypes, ", "))
	}
	c.MaxPositions = intField(text, "max_position_embeddings", intField(text, "n_positions", 0))
	c.Vocab = intField(text, "vocab_size", 0)
	if s, ok := m["torch_dtype"].(string); ok {
		c.TorchDType = s
	} else if s, ok := text["torch_dtype"].(string); ok {
		c.TorchDType = s
	} else if s, ok := m["dtype"].(string); ok { // transformers ≥ 4.56 writes dtype
		c.TorchDType = s
	}
	return c, nil
}

func supportedType(mt string) bool {
	for _, t := range HFModelTypes {
		if t == mt {
			return true
		}
	}
	return false
}

func intField(m map[string]any, key string, def int) int {
	if f, ok := m[key].(float64); ok && f == float64(int(f)) {
		return int(f)
	}
	return def
}

// libraryConfig reads a library model's config.json from the library.
func libraryConfig(lib fs.FS, e Entry) (*HFConfig, error) {
	data, err := fs.ReadFile(lib, e.Config)
	if err != nil {
		return nil, err
	}
	return ParseHFConfig(data)
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
