package plot

import (
	"bytes"
	"encoding/binary"
	"encoding/xml"
	"errors"
	"hash/crc32"
	"io"

	"github.com/memsh/memsh/fsafe"
)

// Every image memsh writes carries a mark, so that it can prove a file is
// one of its own before replacing it: an SVG the comment <!--memsh plot
// 1--> before its root element, a PNG a tEXt chunk "Software" = "memsh
// plot 1" after its header.
const mark = "memsh plot 1"

func init() {
	fsafe.RegisterVerifier(fsafe.SVG, verifySVG)
	fsafe.RegisterVerifier(fsafe.PNG, verifyPNG)
}

var pngSig = []byte("\x89PNG\r\n\x1a\n")

// markImage adds the mark to an SVG's or a PNG's bytes.
func markImage(b []byte, png bool) []byte {
	if png {
		// signature (8), IHDR: length 13, type, data, CRC (25)
		const afterIHDR = 8 + 25
		if len(b) < afterIHDR || !bytes.HasPrefix(b, pngSig) {
			return b
		}
		data := append([]byte("Software\x00"), mark...)
		var chunk bytes.Buffer
		_ = binary.Write(&chunk, binary.BigEndian, uint32(len(data)))
		chunk.WriteString("tEXt")
		chunk.Write(data)
		_ = binary.Write(&chunk, binary.BigEndian, crc32.ChecksumIEEE(append([]byte("tEXt"), data...)))
		out := append([]byte(nil), b[:afterIHDR]...)
		out = append(out, chunk.Bytes()...)
		return append(out, b[afterIHDR:]...)
	}
	i := bytes.Index(b, []byte("<svg"))
	if i < 0 {
		return b
	}
	out := append([]byte(nil), b[:i]...)
	out = append(out, "<!--"+mark+"-->\n"...)
	return append(out, b[i:]...)
}

// verifySVG proves an SVG memsh wrote: well-formed XML whose root is svg,
// with the mark's comment before it.
func verifySVG(r io.Reader) error {
	dec := xml.NewDecoder(r)
	marked, root := false, false
	depth := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errors.New("not well-formed XML")
		}
		switch t := tok.(type) {
		case xml.Comment:
			if depth == 0 && !root && string(t) == mark {
				marked = true
			}
		case xml.StartElement:
			if depth == 0 {
				if root || t.Name.Local != "svg" {
					return errors.New("its root is not one svg element")
				}
				root = true
			}
			depth++
		case xml.EndElement:
			depth--
		}
	}
	if !root || !marked {
		return errors.New("no memsh mark")
	}
	return nil
}

// verifyPNG proves a PNG memsh wrote: every chunk whole with its CRC,
// IHDR first, the mark's tEXt chunk, IEND last and nothing after it.
func verifyPNG(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(b, pngSig) {
		return errors.New("not a PNG")
	}
	i, first, marked := len(pngSig), true, false
	for i+12 <= len(b) {
		n := int(binary.BigEndian.Uint32(b[i:]))
		if n < 0 || i+12+n > len(b) {
			return errors.New("a PNG chunk cut short")
		}
		typ, data := string(b[i+4:i+8]), b[i+8:i+8+n]
		if crc32.ChecksumIEEE(b[i+4:i+8+n]) != binary.BigEndian.Uint32(b[i+8+n:]) {
			return errors.New("a PNG chunk's CRC is wrong")
		}
		if first && typ != "IHDR" {
			return errors.New("no IHDR first")
		}
		first = false
		if typ == "tEXt" && string(data) == "Software\x00"+mark {
			marked = true
		}
		i += 12 + n
		if typ == "IEND" {
			if i != len(b) {
				return errors.New("bytes after IEND")
			}
			if !marked {
				return errors.New("no memsh mark")
			}
			return nil
		}
	}
	return errors.New("no IEND: a truncated PNG")
}
