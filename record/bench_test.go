package record

import (
	"encoding/json"
	"path/filepath"
	"testing"
)

// BenchmarkWrite is appending one record to a --out file: marshal, one
// write and an fsync (the price of losing nothing when killed).
func BenchmarkWrite(b *testing.B) {
	w, _, err := OpenWriter(filepath.Join(b.TempDir(), "out.jsonl"))
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	r := &Record{Kind: "trial", Name: "bs=64", Sweep: "train", Params: json.RawMessage(`{"bs":64}`), Status: "ok",
		GPUs: []Figures{{Device: "cuda:0", Peak: 1 << 30, Total: 16 << 30}}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.Pos[1] = i
		if err := w.Write(r); err != nil {
			b.Fatal(err)
		}
	}
}
