package record

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/memsh/memsh/fsafe"
)

// What makes a line a memsh record, proven rather than guessed from its
// first bytes: it decodes into Record with no field memsh does not write,
// it has every field memsh always writes, its kind and status are memsh's
// values, and its schema is one this memsh reads. Errors never quote what
// the line holds (a foreign file's values may be secrets).

// requiredKeys are the fields every record memsh wrote has.
var requiredKeys = []string{"kind", "name", "status", "time", "pos", "host", "gpus"}

// recordKeys are Record's JSON fields in the order json.Marshal writes
// them: a torn last line is a prefix of a record only if its keys come in
// this order.
var recordKeys = []string{"schema", "kind", "name", "sweep", "params", "status", "error", "time", "at", "pos", "shard", "host", "gpus", "leaks", "baseline", "breakdown"}

func init() { fsafe.RegisterVerifier(fsafe.Records, Verify) }

// parseLine decodes one record and proves it is one of memsh's (n is its
// line number, for messages that name no content).
func parseLine(b []byte, name string, n int) (*Record, error) {
	notRecord := fmt.Errorf("%s:%d: not a memsh record", name, n)
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return nil, notRecord
	}
	if raw, ok := keys["schema"]; ok {
		var v int
		if json.Unmarshal(raw, &v) == nil && v > SchemaVersion {
			return nil, fmt.Errorf("%s:%d: schema %d: written by a newer memsh (this one reads up to %d)", name, n, v, SchemaVersion)
		}
	}
	for _, k := range requiredKeys {
		if _, ok := keys[k]; !ok {
			return nil, fmt.Errorf("%s:%d: not a memsh record (no %q field)", name, n, k)
		}
	}
	rec := new(Record)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(rec); err != nil {
		return nil, notRecord
	}
	if err := rec.validate(); err != nil {
		return nil, fmt.Errorf("%s:%d: not a memsh record: %v", name, n, err)
	}
	if rec.Schema == 0 {
		rec.Schema = 1
	}
	return rec, nil
}

// isRecordPrefix reports whether b (a last line without its newline) is a
// prefix of a line memsh writes: a JSON object whose top-level keys are
// Record's, in the order they are written, and whose text so far is valid
// JSON up to where it was cut.
func isRecordPrefix(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	first, err := dec.Token()
	if err != nil || first != json.Delim('{') {
		return false
	}
	depth, keyNext, next := 1, true, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			// cut in the middle of a token or between them; anything
			// else is malformed
			return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				depth++
			default:
				depth--
				if depth == 0 {
					return false // a whole object is no torn line
				}
				if depth == 1 {
					keyNext = true
				}
			}
			continue
		}
		if depth != 1 {
			continue
		}
		if !keyNext {
			keyNext = true // a scalar value of a top-level field
			continue
		}
		k, _ := tok.(string)
		i := indexFrom(recordKeys, k, next)
		if i < 0 {
			return false
		}
		next, keyNext = i+1, false
	}
}

func indexFrom(keys []string, k string, from int) int {
	for i := from; i < len(keys); i++ {
		if keys[i] == k {
			return i
		}
	}
	return -1
}

// Verify proves that r holds a memsh records file: every line a memsh
// record (see parseLine); a last line without its newline only when it is
// a prefix of a record and follows at least one whole record (a write a
// kill cut short). Nothing of the content is quoted in the error.
func Verify(r io.Reader) error {
	recs, _, partial, _, err := read(r, "the file")
	if err != nil {
		return err
	}
	if partial && len(recs) == 0 {
		return errors.New("no whole memsh record before its last line")
	}
	return nil
}
