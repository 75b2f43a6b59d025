package record

import (
	"bytes"
	"encoding/json"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.starlark.net/starlark"
)

func TestParamsCanonical(t *testing.T) {
	big := starlark.MakeBigInt(new(big.Int).Lsh(big.NewInt(1), 70))
	for _, tc := range []struct {
		in   starlark.StringDict
		want string
	}{
		{starlark.StringDict{"b": starlark.MakeInt(2), "a": starlark.MakeInt(1)}, `{"a":1,"b":2}`},
		{starlark.StringDict{"x": starlark.Float(2)}, `{"x":2.0}`}, // float stays distinct from int
		{starlark.StringDict{"x": starlark.Float(0.5)}, `{"x":0.5}`},
		{starlark.StringDict{"n": big}, `{"n":1180591620717411303424}`},
		{starlark.StringDict{"s": starlark.String("fp16"), "t": starlark.True, "u": starlark.None}, `{"s":"fp16","t":true,"u":null}`},
		{starlark.StringDict{"shape": starlark.Tuple{starlark.MakeInt(2), starlark.MakeInt(3)}}, `{"shape":[2,3]}`},
	} {
		got, err := Params(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.want {
			t.Errorf("Params(%v) = %s, want %s", tc.in, got, tc.want)
		}
		back, err := ParamValues(got)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := Params(dictToStringDict(back))
		if string(again) != tc.want {
			t.Errorf("round trip of %s gave %s", tc.want, again)
		}
	}
}

func dictToStringDict(d *starlark.Dict) starlark.StringDict {
	out := starlark.StringDict{}
	for _, kv := range d.Items() {
		k, _ := starlark.AsString(kv[0])
		v := kv[1]
		if l, ok := v.(*starlark.List); ok { // tuples come back as lists
			elems := make(starlark.Tuple, l.Len())
			for i := range elems {
				elems[i] = l.Index(i)
			}
			v = elems
		}
		out[k] = v
	}
	return out
}

func rec(kind, name, sweep, params string, pos Pos, status string) *Record {
	r := &Record{Kind: kind, Name: name, Sweep: sweep, Status: status, Pos: pos, GPUs: []Figures{}}
	if params != "" {
		r.Params = json.RawMessage(params)
	}
	return r
}

func TestMergeOrdersAndDeduplicates(t *testing.T) {
	shard0 := []*Record{
		rec("experiment", "setup", "", "", Pos{0, -1, 0}, "ok"),
		rec("trial", "n=1", "f", `{"n":1}`, Pos{0, 0, 0}, "ok"),
		rec("trial", "n=3", "f", `{"n":3}`, Pos{2, 0, 0}, "oom"),
		rec("experiment", "after", "", "", Pos{3, -1, 0}, "ok"),
	}
	shard1 := []*Record{
		rec("experiment", "setup", "", "", Pos{0, -1, 0}, "ok"),
		rec("trial", "n=2", "f", `{"n":2}`, Pos{1, 0, 0}, "error"),
		rec("experiment", "after", "", "", Pos{3, -1, 0}, "ok"),
		// a resumed run redid the error point: the later record wins
		rec("trial", "n=2", "f", `{"n":2}`, Pos{1, 0, 0}, "ok"),
	}
	got := Merge(shard0, shard1)
	var names []string
	for _, r := range got {
		names = append(names, r.Name+":"+r.Status)
	}
	want := "setup:ok n=1:ok n=2:ok n=3:oom after:ok"
	if strings.Join(names, " ") != want {
		t.Errorf("Merge = %v, want %s", names, want)
	}
}

func TestShard(t *testing.T) {
	sh, err := ParseShard("1/3")
	if err != nil {
		t.Fatal(err)
	}
	var owned []int
	for u := 0; u < 9; u++ {
		if sh.Owns(u) {
			owned = append(owned, u)
		}
	}
	if len(owned) != 3 || owned[0] != 1 || owned[1] != 4 || owned[2] != 7 {
		t.Errorf("shard 1/3 owns %v", owned)
	}
	if sh.String() != "1/3" {
		t.Errorf("String = %q", sh)
	}
	for _, bad := range []string{"3/3", "-1/2", "1", "a/b", "0/0", "1/-2"} {
		if _, err := ParseShard(bad); err == nil {
			t.Errorf("ParseShard(%q) succeeded", bad)
		}
	}
	if !(Shard{}).Owns(5) {
		t.Error("the zero shard must own every unit")
	}
}

func TestOpenWriterCutsPartialLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	w, recs, err := OpenWriter(path)
	if err != nil || len(recs) != 0 {
		t.Fatal(err, recs)
	}
	r := rec("trial", "n=1", "f", `{"n":1}`, Pos{0, 0, 0}, "ok")
	if err := w.Write(r); err != nil {
		t.Fatal(err)
	}
	w.Close()
	// A run killed in the middle of writing leaves a partial line.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"kind":"trial","name":"n=2","swe`)
	f.Close()

	if recs, err := ReadFile(path); err != nil || len(recs) != 1 {
		t.Fatalf("ReadFile with a partial last line: %v, %d records", err, len(recs))
	}
	w, recs, err = OpenWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Name != "n=1" || !recs[0].Resumable() {
		t.Fatalf("records = %+v", recs)
	}
	if err := w.Write(rec("trial", "n=2", "f", `{"n":2}`, Pos{0, 1, 0}, "oom")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], `"name":"n=2"`) || !strings.Contains(lines[1], `"status":"oom"`) {
		t.Fatalf("file after resume:\n%s", data)
	}
}

func TestReadRejectsMalformedLine(t *testing.T) {
	in := "{\"kind\":\"trial\",\"name\":\"a\",\"status\":\"ok\",\"time\":0,\"pos\":[0,0,0],\"host\":{},\"gpus\":[]}\nnot json\n{\"kind\":\"trial\"}\n"
	_, err := Read(bytes.NewReader([]byte(in)), "x.jsonl")
	if err == nil || !strings.Contains(err.Error(), "x.jsonl:2: not a memsh record") {
		t.Fatalf("err = %v", err)
	}
	_, err = Read(strings.NewReader(`{"name":"a"}`+"\n"), "y.jsonl")
	if err == nil || !strings.Contains(err.Error(), `y.jsonl:1: not a memsh record (no "kind" field)`) {
		t.Fatalf("err = %v", err)
	}
}

func TestResumable(t *testing.T) {
	for _, tc := range []struct {
		r    *Record
		want bool
	}{
		{rec("trial", "n=1", "f", `{"n":1}`, Pos{}, "ok"), true},
		{rec("trial", "n=1", "f", `{"n":1}`, Pos{}, "oom"), true},
		{rec("trial", "n=1", "f", `{"n":1}`, Pos{}, "error"), false}, // errors run again
		{rec("trial", "t", "", "", Pos{}, "ok"), false},              // not a sweep point
		{rec("experiment", "e", "", "", Pos{}, "ok"), false},
	} {
		if got := tc.r.Resumable(); got != tc.want {
			t.Errorf("%s %s %s: Resumable = %v", tc.r.Kind, tc.r.Name, tc.r.Status, got)
		}
	}
}

// Merging shards: a record that failed on a shard that did not run the
// sweep it depends on never replaces the measured one, in any file order.
func TestMergePrefersMeasured(t *testing.T) {
	ok := &Record{Kind: "trial", Name: "final", Status: "ok", Pos: Pos{3, -1, 3}}
	bad := &Record{Kind: "trial", Name: "final", Status: "error", Error: "unknown binary op", Pos: Pos{3, -1, 3}}
	for _, sets := range [][][]*Record{{{ok}, {bad}}, {{bad}, {ok}}} {
		got := Merge(sets...)
		if len(got) != 1 || got[0].Status != "ok" {
			t.Errorf("merge: %+v", got[0])
		}
	}
}
