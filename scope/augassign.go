package scope

import (
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/env"
)

// Augmented assignment in place. Starlark compiles `a += b` as `a = a + b`
// (lists excepted), which would allocate a new tensor; PyTorch updates the
// tensor in place. Before compiling, every augmented assignment whose target
// is free of side effects (a name, x.attr, x[i] with plain subscripts), at
// top level or in any function, becomes
//
//	if a in ·inplace:      # an operator, not a call: cheap for n += 1
//	    a = ·+=(a, b)      # a.InPlaceBinary(+, b): a stays bound to itself
//	else:
//	    a += b             # Starlark's meaning
//
// so values implementing env.InPlaceOperand are updated in place, and every
// other value (ints, lists, strings) behaves exactly as before. Targets with
// calls in them (x[f()] += t) keep Starlark's meaning, evaluated once.

const inPlaceName = "·inplace"

// augOps maps each augmented assignment token to its binary operator.
var augOps = map[syntax.Token]syntax.Token{
	syntax.PLUS_EQ:       syntax.PLUS,
	syntax.MINUS_EQ:      syntax.MINUS,
	syntax.STAR_EQ:       syntax.STAR,
	syntax.SLASH_EQ:      syntax.SLASH,
	syntax.SLASHSLASH_EQ: syntax.SLASHSLASH,
	syntax.PERCENT_EQ:    syntax.PERCENT,
	syntax.AMP_EQ:        syntax.AMP,
	syntax.PIPE_EQ:       syntax.PIPE,
	syntax.CIRCUMFLEX_EQ: syntax.CIRCUMFLEX,
	syntax.LTLT_EQ:       syntax.LTLT,
	syntax.GTGT_EQ:       syntax.GTGT,
}

// augName is the predeclared name of op's in-place builtin.
func augName(op syntax.Token) string { return "·" + op.String() + "=" }

// augBuiltins are the predeclared builtins the rewrite calls.
func augBuiltins() starlark.StringDict {
	d := starlark.StringDict{inPlaceName: inPlaceSet{}}
	for _, op := range augOps {
		// pure (starlark.Builtin.DeclarePure): an in-place operand notes
		// its own change (a tensor: ReachChanged), Starlark's meaning
		// makes a new value
		d[augName(op)] = starlark.NewBuiltin(op.String()+"=", func(_ *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
			x, y := args[0], args[1]
			if ip, ok := x.(env.InPlaceOperand); ok {
				v, err := ip.InPlaceBinary(op, y)
				if v != nil || err != nil {
					return v, err
				}
			}
			return starlark.Binary(op, x, y)
		}).DeclarePure()
	}
	return d
}

// inPlaceSet serves inPlaceName: `x in ·inplace` reports whether x is an
// env.InPlaceOperand.
type inPlaceSet struct{}

func (inPlaceSet) String() string        { return "<in-place operands>" }
func (inPlaceSet) Type() string          { return "in_place_operands" }
func (inPlaceSet) Freeze()               {}
func (inPlaceSet) Truth() starlark.Bool  { return true }
func (inPlaceSet) Hash() (uint32, error) { return 0, nil }
func (inPlaceSet) Has(x starlark.Value) (bool, error) {
	_, ok := x.(env.InPlaceOperand)
	return ok, nil
}

// rewriteAugmented rewrites the augmented assignments of stmts, and of the
// bodies nested in them, in place.
func rewriteAugmented(stmts []syntax.Stmt) {
	for i, st := range stmts {
		switch st := st.(type) {
		case *syntax.AssignStmt:
			if op, ok := augOps[st.Op]; ok && pureTarget(st.LHS) && !hasScope(st.RHS) {
				stmts[i] = inPlaceIf(st, op)
			}
		case *syntax.DefStmt:
			rewriteAugmented(st.Body)
		case *syntax.ForStmt:
			rewriteAugmented(st.Body)
		case *syntax.WhileStmt:
			rewriteAugmented(st.Body)
		case *syntax.IfStmt:
			rewriteAugmented(st.True)
			rewriteAugmented(st.False)
		}
	}
}

func inPlaceIf(st *syntax.AssignStmt, op syntax.Token) syntax.Stmt {
	pos := st.OpPos
	start, _ := st.Span()
	call := func(name string, args ...syntax.Expr) *syntax.CallExpr {
		return &syntax.CallExpr{Fn: &syntax.Ident{NamePos: pos, Name: name}, Lparen: pos, Args: args, Rparen: pos}
	}
	return &syntax.IfStmt{
		If:   start,
		Cond: &syntax.BinaryExpr{X: cloneExpr(st.LHS), OpPos: pos, Op: syntax.IN, Y: &syntax.Ident{NamePos: pos, Name: inPlaceName}},
		True: []syntax.Stmt{&syntax.AssignStmt{OpPos: pos, Op: syntax.EQ, LHS: cloneExpr(st.LHS),
			RHS: call(augName(op), cloneExpr(st.LHS), st.RHS)}},
		ElsePos: pos,
		False:   []syntax.Stmt{st},
	}
}

// pureTarget reports whether evaluating e has no effects beyond reading:
// names, literals, attribute and index reads of such.
func pureTarget(e syntax.Expr) bool {
	switch e := e.(type) {
	case *syntax.Ident, *syntax.Literal:
		return true
	case *syntax.ParenExpr:
		return pureTarget(e.X)
	case *syntax.DotExpr:
		return pureTarget(e.X)
	case *syntax.IndexExpr:
		return pureTarget(e.X) && pureTarget(e.Y)
	case *syntax.UnaryExpr:
		return e.Op == syntax.MINUS && pureTarget(e.X)
	}
	return false
}

// hasScope reports whether e contains a lambda or a comprehension, which
// the resolver gives scopes of their own: such a right-hand side is not
// duplicated.
func hasScope(e syntax.Expr) bool {
	found := false
	syntax.Walk(e, func(n syntax.Node) bool {
		switch n.(type) {
		case *syntax.LambdaExpr, *syntax.Comprehension:
			found = true
		}
		return !found
	})
	return found
}

// cloneExpr copies a pureTarget expression.
func cloneExpr(e syntax.Expr) syntax.Expr {
	switch e := e.(type) {
	case *syntax.Ident:
		return &syntax.Ident{NamePos: e.NamePos, Name: e.Name}
	case *syntax.Literal:
		c := *e
		return &c
	case *syntax.ParenExpr:
		return &syntax.ParenExpr{Lparen: e.Lparen, X: cloneExpr(e.X), Rparen: e.Rparen}
	case *syntax.DotExpr:
		return &syntax.DotExpr{X: cloneExpr(e.X), Dot: e.Dot, NamePos: e.NamePos, Name: &syntax.Ident{NamePos: e.Name.NamePos, Name: e.Name.Name}}
	case *syntax.IndexExpr:
		return &syntax.IndexExpr{X: cloneExpr(e.X), Lbrack: e.Lbrack, Y: cloneExpr(e.Y), Rbrack: e.Rbrack}
	case *syntax.UnaryExpr:
		return &syntax.UnaryExpr{OpPos: e.OpPos, Op: e.Op, X: cloneExpr(e.X)}
	}
	return e
}

// HoldsNoMemory implements env.Opaque.
func (inPlaceSet) HoldsNoMemory() {}
