package scope

import (
	"errors"
	"regexp"
	"sort"
	"strings"

	"go.starlark.net/starlarkstruct"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/starlib"
)

// Python constructs Starlark lacks fail to parse with messages such as "got
// del, want primary expression"; withHint rewords such errors to name the
// memsh way, re-examining the source line at the error.

var (
	gotKeyword = regexp.MustCompile(`^got (del|with|try|except|finally|class|import|from|global|nonlocal|raise|yield|async|await|is|as), want`)
	delTarget  = regexp.MustCompile(`^\s*del\s+([A-Za-z_][A-Za-z_0-9]*)`)
)

const importHint = "memsh modules are predeclared, no import needed: %s; other Starlark files: load(\"file.star\", \"name\")"

// moduleNames lists memsh's predeclared modules, for the import hint.
func moduleNames() string {
	var names []string
	for name, v := range starlib.Predeclared() {
		if _, ok := v.(*starlarkstruct.Module); ok {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

var keywordHints = map[string]string{
	"del":      "Starlark has no 'del' statement; rebind %s = None, or create it inside an experiment() block, whose finish() deletes it",
	"with":     "Starlark has no 'with' statement; use e = experiment(...) ... e.finish()",
	"try":      "Starlark has no 'try'/'except'; run the code as trial(fn, ...): an error or out-of-memory becomes its status and error",
	"except":   "Starlark has no 'try'/'except'; run the code as trial(fn, ...): an error or out-of-memory becomes its status and error",
	"finally":  "Starlark has no 'try'/'finally'; run the code as trial(fn, ...), which always finishes its block",
	"class":    "Starlark has no classes; use a dict for records and def for behaviour",
	"import":   importHint,
	"from":     importHint,
	"global":   "Starlark has no 'global' statement: top-level names are globals (assign them at top level), and a function cannot rebind a global; return the value instead",
	"nonlocal": "Starlark has no 'nonlocal' statement; return the value, or update a list or dict the function can see",
	"raise":    "Starlark has no 'raise'; use fail(\"message\")",
	"yield":    "Starlark has no generators ('yield'); build and return a list",
	"async":    "Starlark has no 'async'/'await'; calls run synchronously (cuda.synchronize() is a no-op)",
	"await":    "Starlark has no 'async'/'await'; calls run synchronously (cuda.synchronize() is a no-op)",
	"is":       "Starlark has no 'is' operator; use == (x == None) or !=",
}

// withHint returns err with a hint when it is a syntax error a Python
// construct caused; other errors are returned as they are.
func withHint(err error, src []byte) error {
	var se syntax.Error
	if !errors.As(err, &se) {
		return err
	}
	line := sourceLine(src, int(se.Pos.Line))
	col := int(se.Pos.Col) - 1
	rest := ""
	if col >= 0 && col <= len(line) {
		rest = line[col:]
	}
	hint := ""
	if m := gotKeyword.FindStringSubmatch(se.Msg); m != nil {
		hint = keywordHints[m[1]]
		switch m[1] {
		case "del":
			name := "x"
			if d := delTarget.FindStringSubmatch(line); d != nil {
				name = d[1]
			}
			hint = strings.Replace(hint, "%s", name, 1)
		case "import", "from":
			hint = strings.Replace(hint, "%s", moduleNames(), 1)
		case "as":
			hint = ""
			if strings.HasPrefix(strings.TrimSpace(line), "with") {
				hint = keywordHints["with"]
			} else if strings.Contains(line, "import") {
				hint = strings.Replace(importHint, "%s", moduleNames(), 1)
			}
		}
	}
	switch {
	case hint != "":
	case strings.HasPrefix(se.Msg, "got '**'") && !strings.HasPrefix(rest, "**)") && !strings.HasPrefix(rest, "**,"):
		hint = "Starlark has no '**' power operator; use x.pow(2) for a tensor, x * x for a number"
	case strings.HasPrefix(se.Msg, "unexpected input character '@'"):
		if strings.HasPrefix(strings.TrimSpace(line), "@") {
			hint = "Starlark has no decorators; write f = profiled(f) (or g(f)) after the def"
		} else {
			hint = "Starlark has no '@' operator; use tensor.matmul(a, b) or a.matmul(b)"
		}
	case strings.Contains(line, "lambda") && !strings.HasPrefix(se.Msg, "unexpected"):
		hint = "a Starlark lambda is one expression; use def for anything longer"
	}
	if hint == "" {
		return err
	}
	se.Msg = hint + " (" + se.Msg + ")"
	return se
}

// sourceLine returns line n (1-based) of src, or "".
func sourceLine(src []byte, n int) string {
	lines := strings.Split(string(src), "\n")
	if n < 1 || n > len(lines) {
		return ""
	}
	return lines[n-1]
}
