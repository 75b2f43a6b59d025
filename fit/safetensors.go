package fit

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// TensorInfo is one tensor of a checkpoint: its dtype (safetensors'
// names: "BF16", "F32", ...) and shape.
type TensorInfo struct {
	DType string
	Shape []int
	File  string // the shard it is in
}

// maxHeader bounds a safetensors header: the format's own limit is 100 MB.
const maxHeader = 100 << 20

// ReadSafetensorsHeader reads the header of a .safetensors file: an 8-byte
// little-endian length, then that many bytes of JSON mapping tensor names
// to {dtype, shape, data_offsets} (and "__metadata__"). Only the header is
// read, never the data.
func ReadSafetensorsHeader(path string) (map[string]TensorInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	var n uint64
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil {
		return nil, fmt.Errorf("%s: no safetensors header: %v", path, err)
	}
	if n == 0 || n > maxHeader {
		return nil, fmt.Errorf("%s: safetensors header of %d bytes (at most %d)", path, n, maxHeader)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, fmt.Errorf("%s: truncated safetensors header: %v", path, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(buf, &raw); err != nil {
		return nil, fmt.Errorf("%s: safetensors header is not JSON: %v", path, err)
	}
	out := map[string]TensorInfo{}
	for name, v := range raw {
		if name == "__metadata__" {
			continue
		}
		var t struct {
			DType string `json:"dtype"`
			Shape []int  `json:"shape"`
		}
		if err := json.Unmarshal(v, &t); err != nil || t.DType == "" {
			return nil, fmt.Errorf("%s: tensor %q has no dtype and shape", path, name)
		}
		out[name] = TensorInfo{DType: t.DType, Shape: t.Shape, File: filepath.Base(path)}
	}
	return out, nil
}

// ReadCheckpointHeaders reads the tensors of the checkpoint beside a
// config.json: model.safetensors, or every shard that
// model.safetensors.index.json's weight_map names. ok is false when there
// is neither.
func ReadCheckpointHeaders(dir string) (tensors map[string]TensorInfo, ok bool, err error) {
	single := filepath.Join(dir, "model.safetensors")
	index := filepath.Join(dir, "model.safetensors.index.json")
	if _, err := os.Stat(index); err == nil {
		data, err := os.ReadFile(index)
		if err != nil {
			return nil, true, err
		}
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(data, &idx); err != nil {
			return nil, true, fmt.Errorf("%s: %v", index, err)
		}
		shards := map[string]bool{}
		for _, f := range idx.WeightMap {
			if strings.Contains(f, "/") || strings.Contains(f, `\`) || f == ".." {
				return nil, true, fmt.Errorf("%s: shard %q is not a file beside it", index, f)
			}
			shards[f] = true
		}
		tensors = map[string]TensorInfo{}
		for _, f := range sortedKeys(shards) {
			h, err := ReadSafetensorsHeader(filepath.Join(dir, f))
			if err != nil {
				return nil, true, err
			}
			for k, v := range h {
				tensors[k] = v
			}
		}
		for name, f := range idx.WeightMap {
			if _, ok := tensors[name]; !ok {
				return nil, true, fmt.Errorf("%s: tensor %q is not in its shard %s", index, name, f)
			}
		}
		return tensors, true, nil
	}
	if _, err := os.Stat(single); err == nil {
		t, err := ReadSafetensorsHeader(single)
		return t, true, err
	}
	return nil, false, nil
}

// safetensorsDType maps a torch dtype name to safetensors' name.
var safetensorsDType = map[string]string{
	"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
	"int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}

// ParamInfo is one parameter of the built model.
type ParamInfo struct {
	Name  string
	Shape []int
}

// CheckCheckpoint compares the checkpoint's tensors with the built
// model's parameters: every parameter the file holds must have the
// model's shape and the config's dtype (torch_dtype: the dtype the file
// stores; "" skips the dtype check), and every tensor of the file must be
// a parameter, a known buffer or a tied weight. Names may carry the
// checkpoint's prefixes ("transformer." for GPT-2's). It returns the
// number of tensors checked, or an error naming the first tensor that
// differs.
func CheckCheckpoint(tensors map[string]TensorInfo, params []ParamInfo, torchDType string, tied []string) (int, error) {
	byName := map[string]ParamInfo{}
	for _, p := range params {
		byName[p.Name] = p
	}
	wantDT := safetensorsDType[torchDType]
	checked := 0
	for _, name := range sortedKeys(tensors) {
		t := tensors[name]
		p, ok := byName[name]
		if !ok {
			p, ok = byName["transformer."+name] // GPT-2's checkpoints have no prefix
		}
		if !ok {
			if knownBuffer(name) || slices.Contains(tied, name) {
				continue
			}
			return checked, fmt.Errorf("checkpoint tensor %s (%s, %s) is not a parameter of the model memsh built", name, t.DType, shapeText(t.Shape))
		}
		shape := p.Shape // GPT-2's Conv1D weights are [in, out] in the model and the file alike
		if !slices.Equal(shape, t.Shape) {
			return checked, fmt.Errorf("checkpoint tensor %s has shape %s, the model's parameter %s", name, shapeText(t.Shape), shapeText(shape))
		}
		if wantDT != "" && t.DType != wantDT {
			return checked, fmt.Errorf("checkpoint tensor %s is stored as %s, but the config's torch_dtype is %s", name, t.DType, torchDType)
		}
		checked++
	}
	return checked, nil
}

// knownBuffer reports checkpoint tensors that are buffers, not
// parameters: GPT-2's causal masks, old Llama checkpoints' rotary
// inv_freq.
func knownBuffer(name string) bool {
	return strings.HasSuffix(name, ".attn.bias") || strings.HasSuffix(name, ".attn.masked_bias") || strings.HasSuffix(name, "rotary_emb.inv_freq")
}

func shapeText(s []int) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
