package snapshot

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/memsh/memsh/fsafe"
)

// This file is a small pickle writer: protocol 2, and only the opcodes
// that both Python's pickle and pytorch.org/memory_viz's own unpickler
// (MemoryViz.js) read: PROTO, EMPTY_DICT/MARK/SETITEMS, EMPTY_LIST/
// MARK/APPENDS, MARK/TUPLE, BININT1, BININT2, BININT, LONG1, BINFLOAT,
// BINUNICODE, NONE, NEWTRUE, NEWFALSE and STOP. No memo is written.

// Dict is a Python dict with its keys in order.
type Dict []Item

// Item is one key and value of a Dict.
type Item struct {
	Key   string
	Value any
}

// Tuple is a Python tuple.
type Tuple []any

const (
	opMark     = '('
	opStop     = '.'
	opBinint   = 'J'
	opBinint1  = 'K'
	opBinint2  = 'M'
	opNone     = 'N'
	opBinUni   = 'X'
	opAppends  = 'e'
	opEmptyDic = '}'
	opEmptyLst = ']'
	opSetitems = 'u'
	opTuple    = 't'
	opBinfloat = 'G'
	opProto    = 0x80
	opNewTrue  = 0x88
	opNewFalse = 0x89
	opLong1    = 0x8a

	batch = 1000 // items per SETITEMS/APPENDS, as Python's pickler
)

// Pickle writes v as a protocol 2 pickle. v may be nil, bool, int,
// int64, uint64, float64, string, Dict, Tuple, []any, []Dict, or any
// nesting of those.
func Pickle(w io.Writer, v any) error {
	bw := bufio.NewWriter(w)
	p := &pickler{w: bw}
	p.w.WriteByte(opProto)
	p.w.WriteByte(2)
	if err := p.value(v); err != nil {
		return err
	}
	p.w.WriteByte(opStop)
	return bw.Flush()
}

type pickler struct {
	w   *bufio.Writer
	buf [9]byte
}

func (p *pickler) value(v any) error {
	switch v := v.(type) {
	case nil:
		p.w.WriteByte(opNone)
	case bool:
		if v {
			p.w.WriteByte(opNewTrue)
		} else {
			p.w.WriteByte(opNewFalse)
		}
	case int:
		p.int(int64(v))
	case int64:
		p.int(v)
	case uint64:
		if v > math.MaxInt64 {
			p.long(v, true)
		} else {
			p.int(int64(v))
		}
	case float64:
		p.w.WriteByte(opBinfloat)
		binary.BigEndian.PutUint64(p.buf[:8], math.Float64bits(v))
		p.w.Write(p.buf[:8])
	case string:
		p.w.WriteByte(opBinUni)
		binary.LittleEndian.PutUint32(p.buf[:4], uint32(len(v)))
		p.w.Write(p.buf[:4])
		p.w.WriteString(v)
	case Dict:
		p.w.WriteByte(opEmptyDic)
		for i := 0; i < len(v); i += batch {
			p.w.WriteByte(opMark)
			for _, it := range v[i:min(i+batch, len(v))] {
				p.value(it.Key)
				if err := p.value(it.Value); err != nil {
					return err
				}
			}
			p.w.WriteByte(opSetitems)
		}
	case []Dict:
		l := make([]any, len(v))
		for i := range v {
			l[i] = v[i]
		}
		return p.value(l)
	case []any:
		p.w.WriteByte(opEmptyLst)
		for i := 0; i < len(v); i += batch {
			p.w.WriteByte(opMark)
			for _, x := range v[i:min(i+batch, len(v))] {
				if err := p.value(x); err != nil {
					return err
				}
			}
			p.w.WriteByte(opAppends)
		}
	case Tuple:
		p.w.WriteByte(opMark)
		for _, x := range v {
			if err := p.value(x); err != nil {
				return err
			}
		}
		p.w.WriteByte(opTuple)
	default:
		return fmt.Errorf("pickle: cannot encode %T", v)
	}
	return nil
}

// int writes a signed integer with the shortest opcode.
func (p *pickler) int(v int64) {
	switch {
	case v >= 0 && v <= 0xff:
		p.w.WriteByte(opBinint1)
		p.w.WriteByte(byte(v))
	case v >= 0 && v <= 0xffff:
		p.w.WriteByte(opBinint2)
		binary.LittleEndian.PutUint16(p.buf[:2], uint16(v))
		p.w.Write(p.buf[:2])
	case v >= math.MinInt32 && v <= math.MaxInt32:
		p.w.WriteByte(opBinint)
		binary.LittleEndian.PutUint32(p.buf[:4], uint32(int32(v)))
		p.w.Write(p.buf[:4])
	default:
		p.long(uint64(v), v >= 0)
	}
}

// long writes LONG1: the shortest little-endian two's complement bytes of
// the value whose 64 bits are u (nonneg says whether it is >= 0; an
// unsigned value above MaxInt64 needs a ninth, zero byte).
func (p *pickler) long(u uint64, nonneg bool) {
	binary.LittleEndian.PutUint64(p.buf[:8], u)
	n := 8
	if nonneg {
		p.buf[8] = 0
		n = 9
		for n > 1 && p.buf[n-1] == 0 && p.buf[n-2]&0x80 == 0 {
			n--
		}
	} else {
		for n > 1 && p.buf[n-1] == 0xff && p.buf[n-2]&0x80 != 0 {
			n--
		}
	}
	p.w.WriteByte(opLong1)
	p.w.WriteByte(byte(n))
	p.w.Write(p.buf[:n])
}

// Mark is the first item of every snapshot memsh writes ("memsh":
// Mark): memory_viz ignores it, and it lets memsh prove a file is one of
// its own snapshots before it replaces it (Verify).
const Mark = "memsh memory snapshot 1"

func init() { fsafe.RegisterVerifier(fsafe.Snapshot, Verify) }

// Verify proves that r holds a snapshot memsh wrote: a protocol 2 pickle
// of only the opcodes Pickle writes, well formed to its STOP and nothing
// after it, whose value is a dict whose first item is "memsh": Mark.
func Verify(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	var head bytes.Buffer
	head.Write([]byte{opProto, 2, opEmptyDic, opMark})
	hp := &pickler{w: bufio.NewWriter(&head)}
	_ = hp.value("memsh")
	_ = hp.value(Mark)
	hp.w.Flush()
	if !bytes.HasPrefix(b, head.Bytes()) {
		return errors.New("no memsh mark")
	}
	// walk every opcode: arguments in bounds, marks balanced, one STOP at
	// the end
	i, marks := 2, 0
	for i < len(b) {
		op := b[i]
		i++
		need := 0
		switch op {
		case opStop:
			if i != len(b) || marks != 0 {
				return errors.New("malformed pickle")
			}
			return nil
		case opMark:
			marks++
		case opSetitems, opAppends, opTuple:
			if marks == 0 {
				return errors.New("malformed pickle")
			}
			marks--
		case opEmptyDic, opEmptyLst, opNone, opNewTrue, opNewFalse:
		case opBinint1:
			need = 1
		case opBinint2:
			need = 2
		case opBinint:
			need = 4
		case opBinfloat:
			need = 8
		case opLong1:
			if i >= len(b) {
				return errors.New("malformed pickle")
			}
			need = 1 + int(b[i])
		case opBinUni:
			if i+4 > len(b) {
				return errors.New("malformed pickle")
			}
			need = 4 + int(binary.LittleEndian.Uint32(b[i:]))
		default:
			return errors.New("an opcode memsh's snapshots do not use")
		}
		if i+need > len(b) {
			return errors.New("malformed pickle")
		}
		i += need
	}
	return errors.New("no STOP: a truncated pickle")
}
