package plot

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gplot "gonum.org/v1/plot"
)

// memsh's images carry its mark and stay valid images; a file memsh did
// not write (an image of the same format) is never replaced.
func TestImagesMarked(t *testing.T) {
	dir := t.TempDir()
	p := gplot.New()
	p.Title.Text = "x"
	for _, ext := range []string{".svg", ".png"} {
		path := filepath.Join(dir, "a"+ext)
		if err := Save(p, path, 0, 0); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(path)
		verify := verifySVG
		if ext == ".png" {
			verify = verifyPNG
			if _, err := png.Decode(bytes.NewReader(b)); err != nil {
				t.Fatalf("the marked PNG does not decode: %v", err)
			}
		}
		if err := verify(bytes.NewReader(b)); err != nil {
			t.Fatalf("%s: %v", ext, err)
		}
		// memsh replaces its own image
		if err := Save(p, path, 0, 0); err != nil {
			t.Fatalf("%s over memsh's own: %v", ext, err)
		}
		// not one of a user's own
		foreign := filepath.Join(dir, "mine"+ext)
		content := `<svg xmlns="http://www.w3.org/2000/svg"></svg>`
		if ext == ".png" {
			content = string(b[:len(b)-40]) // cut: not whole
		}
		if err := os.WriteFile(foreign, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := Save(p, foreign, 0, 0); err == nil || !strings.Contains(err.Error(), "refusing to replace") {
			t.Errorf("%s: a foreign image: %v", ext, err)
		}
		if got, _ := os.ReadFile(foreign); string(got) != content {
			t.Errorf("%s: the foreign image changed", ext)
		}
	}
}
