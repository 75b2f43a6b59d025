package nn

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	staroptim "github.com/memsh/memsh/starlib/optim"
)

// docsPage is the reference page of nn, nn.functional and optim
// (docs/nn.md), relative to this package's directory.
const docsPage = "../../docs/nn.md"

// docEntries returns the places of the page where a member counts as
// documented: the headings and the first cell of every table row, outside
// fenced code blocks.
func docEntries(page string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(page, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		switch {
		case fenced:
		case strings.HasPrefix(line, "#"):
			out = append(out, line)
		case strings.HasPrefix(line, "|"):
			cells := strings.Split(line, "|")
			if len(cells) > 1 && strings.Trim(cells[1], " -:") != "" {
				out = append(out, cells[1])
			}
		}
	}
	return out
}

// requiredNames lists, from the registered values, the names the page
// must show: nn.X, nn.functional.X and optim.X for every module member,
// m.X for every nn.Module method and attribute, opt.X for an optimizer's,
// scaler.X for a GradScaler's and report.X for nn.track's report.
func requiredNames() []string {
	var names []string
	for name := range Module.Members {
		names = append(names, "nn."+name)
	}
	for name := range Functional.Members {
		names = append(names, "nn.functional."+name)
	}
	for name := range staroptim.Module.Members {
		names = append(names, "optim."+name)
	}
	for name := range moduleMethods {
		names = append(names, "m."+name)
	}
	names = append(names, "m.training")
	for _, name := range (&staroptim.Optimizer{}).AttrNames() {
		names = append(names, "opt."+name)
	}
	for _, name := range (&staroptim.GradScaler{}).AttrNames() {
		names = append(names, "scaler."+name)
	}
	for _, name := range (&TrackReport{}).AttrNames() {
		names = append(names, "report."+name)
	}
	slices.Sort(names)
	return names
}

// mentions reports whether entry names name as a whole dotted name: not
// preceded by a letter, digit, '_' or '.' (torch.nn.Linear is not
// nn.Linear) nor followed by a letter, digit or '_' (nn.ModuleList is not
// nn.Module).
func mentions(entry, name string) bool {
	for i := 0; ; {
		j := strings.Index(entry[i:], name)
		if j < 0 {
			return false
		}
		j += i
		end := j + len(name)
		if (j == 0 || !nameByte(entry[j-1]) && entry[j-1] != '.') && (end == len(entry) || !nameByte(entry[end])) {
			return true
		}
		i = j + 1
	}
}

func nameByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// missingFromDocs returns the names that no entry mentions.
func missingFromDocs(entries, names []string) []string {
	var missing []string
	for _, name := range names {
		if !slices.ContainsFunc(entries, func(e string) bool { return mentions(e, name) }) {
			missing = append(missing, name)
		}
	}
	return missing
}

// memberRef finds the nn, nn.functional and optim names in an entry.
var memberRef = regexp.MustCompile(`(?:^|[^\w.])(nn\.functional\.\w+|nn\.\w+|optim\.\w+)`)

// unknownInDocs returns the nn.X, nn.functional.X and optim.X names the
// entries give that are no registered member.
func unknownInDocs(entries []string) []string {
	var unknown []string
	for _, e := range entries {
		for _, m := range memberRef.FindAllStringSubmatch(e, -1) {
			name := m[1]
			var ok bool
			switch {
			case strings.HasPrefix(name, "nn.functional."):
				_, ok = Functional.Members[strings.TrimPrefix(name, "nn.functional.")]
			case strings.HasPrefix(name, "nn."):
				_, ok = Module.Members[strings.TrimPrefix(name, "nn.")]
			default:
				_, ok = staroptim.Module.Members[strings.TrimPrefix(name, "optim.")]
			}
			if !ok && !slices.Contains(unknown, name) {
				unknown = append(unknown, name)
			}
		}
	}
	return unknown
}

func readDocsPage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(docsPage)
	if err != nil {
		t.Fatalf("the nn reference page: %v", err)
	}
	return string(b)
}

// TestDocsListEveryMember keeps docs/nn.md complete: every member of nn,
// nn.functional and optim, every module method and the optimizer's,
// GradScaler's and nn.track report's attributes appear in a heading or in
// the first cell of a table row.
func TestDocsListEveryMember(t *testing.T) {
	entries := docEntries(readDocsPage(t))
	for _, name := range missingFromDocs(entries, requiredNames()) {
		t.Errorf("docs/nn.md does not document %s: give it a heading, or a table row whose first cell names it", name)
	}
}

// TestDocsNameOnlyMembers keeps docs/nn.md honest: the nn, nn.functional
// and optim names its headings and table rows give are registered.
func TestDocsNameOnlyMembers(t *testing.T) {
	for _, name := range unknownInDocs(docEntries(readDocsPage(t))) {
		t.Errorf("docs/nn.md documents %s, which is not registered", name)
	}
}

// TestDocsCheckCatchesRemoval checks the check: the page without the
// nn.Linear heading, the F.linear row and the opt.step row is reported.
func TestDocsCheckCatchesRemoval(t *testing.T) {
	page := readDocsPage(t)
	before := missingFromDocs(docEntries(page), requiredNames()) // TestDocsListEveryMember's to report
	var kept []string
	for _, line := range strings.Split(page, "\n") {
		if line == "### nn.Linear" || strings.HasPrefix(line, "| `nn.functional.linear(") || strings.HasPrefix(line, "| `opt.step()`") {
			continue
		}
		kept = append(kept, line)
	}
	got := slices.DeleteFunc(missingFromDocs(docEntries(strings.Join(kept, "\n")), requiredNames()),
		func(name string) bool { return slices.Contains(before, name) })
	if want := []string{"nn.Linear", "nn.functional.linear", "opt.step"}; !slices.Equal(got, want) {
		t.Errorf("missing from the page with three entries removed: got %v, want %v", got, want)
	}
	if got := unknownInDocs([]string{"### nn.NoSuchLayer", "`nn.functional.no_such_op(x)`", "torch.nn.Linear", "`optim.Lion(params)`"}); !slices.Equal(got, []string{"nn.NoSuchLayer", "nn.functional.no_such_op", "optim.Lion"}) {
		t.Errorf("unknown names: got %v", got)
	}
}
