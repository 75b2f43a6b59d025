package record

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzReadRecords: the reader never panics, and what it accepts writes
// back (WriteAll) to text it reads again as the same records.
func FuzzReadRecords(f *testing.F) {
	f.Add([]byte(sampleLine(1) + sampleLine(2)))
	f.Add([]byte(`{"kind":"experiment","name":"x","status":"ok","pos":[0,-1,0],"host":{},"gpus":[]}`))
	f.Add([]byte("\n\n" + sampleLine(3)[:30]))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := Read(bytes.NewReader(data), "fuzz")
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := WriteAll(&buf, recs); err != nil {
			t.Fatalf("WriteAll: %v", err)
		}
		again, err := Read(bytes.NewReader(buf.Bytes()), "again")
		if err != nil {
			t.Fatalf("written records do not read back: %v\n%s", err, buf.Bytes())
		}
		if len(again) != len(recs) {
			t.Fatalf("%d records, %d after a round trip", len(recs), len(again))
		}
		for i := range recs {
			a, _ := json.Marshal(recs[i])
			b, _ := json.Marshal(again[i])
			if !bytes.Equal(a, b) {
				t.Fatalf("record %d changed in a round trip:\n%s\n%s", i, a, b)
			}
		}
		_ = Merge(recs, again)
	})
}
