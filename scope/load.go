package scope

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	starlarkjson "go.starlark.net/lib/json"
	"go.starlark.net/resolve"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/env"
)

// load() is sandboxed: a module path resolves only inside the load roots —
// the directory of the main script (the first file Exec ran; the working
// directory for a REPL or -c code) and Options.LoadPath. A relative path is
// looked up next to the file that loads it, then in each extra root; ".."
// components are refused, as are absolute paths outside the roots and
// symlinks whose target leaves them. Errors never quote the file: a file
// that is not valid Starlark (a .env, a key file) is reported by line
// number only.

// loadRoots returns the load roots, absolute and with symlinks resolved,
// the main root first.
func (s *Session) loadRoots() []string {
	main := s.mainDir
	if main == "" {
		main, _ = os.Getwd()
	}
	var roots []string
	seen := map[string]bool{}
	for _, r := range append([]string{main}, s.opts.LoadPath...) {
		if r == "" {
			continue
		}
		abs, err := filepath.Abs(r)
		if err != nil {
			continue
		}
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			abs = real
		}
		if !seen[abs] {
			seen[abs] = true
			roots = append(roots, abs)
		}
	}
	return roots
}

// LoadRoots returns the directories load() resolves in, the main root
// first.
func (s *Session) LoadRoots() []string { return s.loadRoots() }

func within(p string, roots []string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+string(filepath.Separator)) || r == string(filepath.Separator) {
			return true
		}
	}
	return false
}

// resolveLoad maps a load() module string to a real file path inside the
// load roots. from is the file of the load statement.
func (s *Session) resolveLoad(from, module string) (string, error) {
	roots := s.loadRoots()
	where := strings.Join(roots, ", ")
	if module == "" {
		return "", errors.New("empty module path")
	}
	for _, c := range strings.Split(filepath.ToSlash(module), "/") {
		if c == ".." {
			return "", fmt.Errorf("'..' is not allowed in a load path (load resolves inside %s; add a directory with --load-path)", where)
		}
	}
	var candidates []string
	if filepath.IsAbs(module) {
		p := filepath.Clean(module)
		lexRoots := roots
		for _, r := range append([]string{s.mainDir}, s.opts.LoadPath...) {
			if abs, err := filepath.Abs(r); err == nil && r != "" {
				lexRoots = append(lexRoots, abs)
			}
		}
		if s.mainDir == "" {
			if wd, err := os.Getwd(); err == nil {
				lexRoots = append(lexRoots, wd)
			}
		}
		if !within(p, lexRoots) {
			return "", fmt.Errorf("absolute path outside the load roots (%s; add a directory with --load-path)", where)
		}
		candidates = []string{p}
	} else {
		base := roots[0]
		if from != "" && !strings.HasPrefix(from, "<") {
			if abs, err := filepath.Abs(filepath.Dir(from)); err == nil {
				if real, err := filepath.EvalSymlinks(abs); err == nil && within(real, roots) {
					base = real
				}
			}
		}
		candidates = append(candidates, filepath.Join(base, module))
		for _, r := range roots[1:] {
			candidates = append(candidates, filepath.Join(r, module))
		}
	}
	for _, c := range candidates {
		real, err := filepath.EvalSymlinks(c)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", pathErr(err)
		}
		if !within(real, roots) {
			return "", fmt.Errorf("a symlink leads outside the load roots (%s)", where)
		}
		return real, nil
	}
	return "", fmt.Errorf("no such file in the load roots (%s)", where)
}

// load implements Starlark's load(): it resolves the module in the load
// roots and runs the file once per Session, caching its globals, with the
// Session's builtins, step limit and interrupt; a load cycle is an error.
func (s *Session) load(thread *starlark.Thread, module string) (starlark.StringDict, error) {
	from := ""
	if thread.CallStackDepth() > 0 {
		from = thread.CallFrame(0).Pos.Filename()
	}
	var path string
	var src []byte
	var err error
	if lib, ok := s.libraryModule(from, module); ok {
		path = libraryPrefix + lib
	} else if strings.HasPrefix(from, libraryPrefix) {
		return nil, fmt.Errorf("no such module in memsh's library")
	} else if path, err = s.resolveLoad(from, module); err != nil {
		if lib, ok := s.libraryFallback(module); ok {
			path, err = libraryPrefix+lib, nil
		} else if s.opts.Library != nil && strings.HasPrefix(err.Error(), "no such file") {
			return nil, fmt.Errorf("%v nor in memsh's library (models/*.star)", err)
		} else {
			return nil, err
		}
	}
	if e, ok := s.loaded[path]; ok {
		if e == nil {
			return nil, fmt.Errorf("cycle in load graph")
		}
		return e.globals, e.err
	}
	if lib, ok := strings.CutPrefix(path, libraryPrefix); ok {
		src, err = fs.ReadFile(s.opts.Library, lib)
	} else {
		src, err = ReadScript(path)
	}
	if err != nil {
		return nil, pathErr(err)
	}
	if strings.HasSuffix(path, ".json") {
		g, err := jsonModule(s.thread, src)
		if s.loaded == nil {
			s.loaded = map[string]*loadEntry{}
		}
		s.loaded[path] = &loadEntry{g, err}
		return g, err
	}
	prog, err := s.compileModule(module, path, src)
	if err != nil {
		return nil, err
	}
	if s.loaded == nil {
		s.loaded = map[string]*loadEntry{}
	}
	s.loaded[path] = nil // in progress
	lt := &starlark.Thread{Name: "load " + module, Print: s.thread.Print, Load: s.load}
	env.Install(lt, s.env)
	lt.SetLocal(sessionKey, s)
	lt.SetMutations(&s.mutations)
	if s.opts.MaxSteps > 0 {
		lt.SetMaxExecutionSteps(s.opts.MaxSteps)
	}
	s.loadMu.Lock()
	s.loading = append(s.loading, lt)
	s.loadMu.Unlock()
	g, err := prog.Init(lt, s.builtins)
	g.Freeze()
	s.loadMu.Lock()
	s.loading = removeHook(s.loading, lt)
	s.loadMu.Unlock()
	s.loaded[path] = &loadEntry{g, err}
	return g, err
}

// jsonModule is a loaded .json file: one member, data, the file's value
// decoded as json.decode decodes it (objects as dicts, arrays as lists),
// frozen. A file that is not JSON is reported without its text.
//
//	load("models/configs/llama-3.2-1b.json", cfg = "data")
func jsonModule(thread *starlark.Thread, src []byte) (starlark.StringDict, error) {
	decode := starlarkjson.Module.Members["decode"]
	v, err := starlark.Call(thread, decode, starlark.Tuple{starlark.String(src)}, nil)
	if err != nil {
		return nil, errors.New("not a valid JSON file")
	}
	v.Freeze()
	return starlark.StringDict{"data": v}, nil
}

// compileModule parses and resolves a loaded file. A file whose name does
// not end in .star is not quoted in errors: its syntax or resolve error is
// reported by line only, so that loading a secrets file by mistake does not
// print its values.
func (s *Session) compileModule(module, path string, src []byte) (*starlark.Program, error) {
	quote := strings.HasSuffix(path, ".star")
	f, err := fileOptions.Parse(path, src, 0)
	if err != nil {
		if quote {
			return nil, withHint(err, src)
		}
		var se syntax.Error
		line := int32(0)
		if errors.As(err, &se) {
			line = se.Pos.Line
		}
		return nil, fmt.Errorf("not a valid Starlark module (syntax error at line %d)", line)
	}
	rewriteAugmented(f.Stmts)
	prog, err := starlark.FileProgram(f, s.builtins.Has)
	if err != nil {
		if quote {
			return nil, err
		}
		var el resolve.ErrorList
		line := int32(0)
		if errors.As(err, &el) && len(el) > 0 {
			line = el[0].Pos.Line
		}
		return nil, fmt.Errorf("not a valid Starlark module (error at line %d)", line)
	}
	return prog, nil
}

// libraryPrefix names the library's modules (Options.Library) in the
// loaded-module cache and in tracebacks: "memsh:models/llama.star".
const libraryPrefix = "memsh:"

// libraryModule resolves a load() made by one of the library's own
// modules: in the library only, relative to its root.
func (s *Session) libraryModule(from, module string) (string, bool) {
	if s.opts.Library == nil || !strings.HasPrefix(from, libraryPrefix) {
		return "", false
	}
	return s.libraryFallback(module)
}

// libraryFallback resolves module in the library when it holds it: a
// relative, clean path naming a file.
func (s *Session) libraryFallback(module string) (string, bool) {
	if s.opts.Library == nil || filepath.IsAbs(module) {
		return "", false
	}
	p := strings.TrimPrefix(filepath.ToSlash(module), "./")
	if !fs.ValidPath(p) {
		return "", false
	}
	if fi, err := fs.Stat(s.opts.Library, p); err != nil || fi.IsDir() {
		return "", false
	}
	return p, true
}

type loadEntry struct {
	globals starlark.StringDict
	err     error
}

// pathErr drops the path from a file system error (the caller names the
// module).
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
