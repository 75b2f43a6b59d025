package snapshot

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestPickleBytes(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want string
	}{
		{Dict{{"a", 1}}, "\x80\x02}(X\x01\x00\x00\x00aK\x01u."},
		{[]any{}, "\x80\x02]."},
		{Dict{}, "\x80\x02}."},
		{[]any{nil, true, false}, "\x80\x02](N\x88\x89e."},
		{300, "\x80\x02M\x2c\x01."},
		{-1, "\x80\x02J\xff\xff\xff\xff."},
		{int64(1) << 40, "\x80\x02\x8a\x06\x00\x00\x00\x00\x00\x01."},
		{int64(-1) << 40, "\x80\x02\x8a\x06\x00\x00\x00\x00\x00\xff."},
		{int64(1) << 31, "\x80\x02\x8a\x05\x00\x00\x00\x80\x00."}, // needs a sign byte
		{uint64(math.MaxUint64), "\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00."},
		{Tuple{0, 0}, "\x80\x02(K\x00K\x00t."},
		{1.5, "\x80\x02G\x3f\xf8\x00\x00\x00\x00\x00\x00."},
	} {
		var b bytes.Buffer
		if err := Pickle(&b, tc.v); err != nil {
			t.Fatal(err)
		}
		if b.String() != tc.want {
			t.Errorf("Pickle(%#v) = %q, want %q", tc.v, b.String(), tc.want)
		}
	}
	if err := Pickle(&bytes.Buffer{}, struct{}{}); err == nil {
		t.Error("Pickle of an unsupported type succeeded")
	}
}

// python3 returns the path of python3, or skips the test saying why.
func python3(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found: skipping the check that Python's pickle loads the file")
	}
	return p
}

// The pickle loads with Python's pickle module, with the values written.
func TestPickleLoadsInPython(t *testing.T) {
	py := python3(t)
	many := make([]any, 2500) // more than one APPENDS batch
	for i := range many {
		many[i] = i * 7
	}
	bigDict := Dict{}
	for i := 0; i < 1200; i++ { // more than one SETITEMS batch
		bigDict = append(bigDict, Item{"k" + string(rune('a'+i%26)) + strings.Repeat("x", i/26), i})
	}
	v := Dict{
		{"ints", []any{0, 255, 256, 65535, 65536, -1, math.MinInt32, math.MaxInt32, int64(math.MaxInt32) + 1,
			int64(math.MinInt32) - 1, int64(math.MaxInt64), int64(math.MinInt64), uint64(math.MaxUint64), int64(140737488355328)}},
		{"floats", []any{0.0, -2.5, 1e300}},
		{"strings", []any{"", "cuda:0", "ünïcode ✓", strings.Repeat("s", 70000)}},
		{"nested", Dict{{"t", Tuple{0, 0}}, {"l", []any{Dict{{"frames", []any{}}}}}, {"none", nil}, {"yes", true}, {"no", false}}},
		{"many", many},
		{"big", bigDict},
	}
	path := filepath.Join(t.TempDir(), "v.pickle")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := Pickle(f, v); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command(py, "-c", `
import json, pickle, sys
v = pickle.load(open(sys.argv[1], "rb"))
def plain(x):
    if isinstance(x, tuple): return {"tuple": [plain(y) for y in x]}
    if isinstance(x, list): return [plain(y) for y in x]
    if isinstance(x, dict): return {k: plain(y) for k, y in x.items()}
    if isinstance(x, int) and not isinstance(x, bool): return str(x)
    return x
print(json.dumps(plain(v)))
`, path).CombinedOutput()
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, out)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	ints := got["ints"].([]any)
	want := []string{"0", "255", "256", "65535", "65536", "-1", "-2147483648", "2147483647", "2147483648",
		"-2147483649", "9223372036854775807", "-9223372036854775808", "18446744073709551615", "140737488355328"}
	for i, w := range want {
		if ints[i] != w {
			t.Errorf("int %d: Python read %v, want %s", i, ints[i], w)
		}
	}
	if !reflect.DeepEqual(got["floats"], []any{0.0, -2.5, 1e300}) {
		t.Errorf("floats: %v", got["floats"])
	}
	strs := got["strings"].([]any)
	if strs[2] != "ünïcode ✓" || len(strs[3].(string)) != 70000 {
		t.Errorf("strings: %q ...", strs[:3])
	}
	nested := got["nested"].(map[string]any)
	if !reflect.DeepEqual(nested["t"], map[string]any{"tuple": []any{"0", "0"}}) || nested["none"] != nil || nested["yes"] != true || nested["no"] != false {
		t.Errorf("nested: %v", nested)
	}
	if m := got["many"].([]any); len(m) != 2500 || m[2499] != "17493" {
		t.Errorf("many: %d items, last %v", len(m), m[len(m)-1])
	}
	if b := got["big"].(map[string]any); len(b) != 1200 {
		t.Errorf("big dict: %d items", len(b))
	}
}

// Verify proves a snapshot memsh wrote, and nothing else: not another
// protocol 2 pickle (a model's state dict), not one cut short, not one
// with bytes after its STOP.
func TestVerify(t *testing.T) {
	var b bytes.Buffer
	if err := Pickle(&b, Dict{{"memsh", Mark}, {"segments", []any{Dict{{"address", uint64(1 << 40)}, {"size", 3.5}}}}, {"device_traces", []any{[]any{}}}}); err != nil {
		t.Fatal(err)
	}
	good := b.Bytes()
	if err := Verify(bytes.NewReader(good)); err != nil {
		t.Fatalf("memsh's own snapshot: %v", err)
	}
	var foreign bytes.Buffer
	_ = Pickle(&foreign, Dict{{"segments", []any{}}, {"device_traces", []any{}}})
	for name, data := range map[string][]byte{
		"foreign":   foreign.Bytes(),
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte(nil), good...), 'x'),
		"bad op":    append(append([]byte(nil), good[:len(good)-1]...), 'c', '.'),
		"python":    []byte("\x80\x02}q\x00(X\x05\x00\x00\x00memshq\x01X\x01\x00\x00\x00xq\x02u."),
	} {
		if err := Verify(bytes.NewReader(data)); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
}
