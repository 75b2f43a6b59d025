// Package starlib assembles memsh's Starlark environment: the modules
// (cuda, tensor, each a sub-package exporting `var Module`) and the global
// builtins that need no Session: gc, fmt_bytes and the byte-unit constants.
// The Session adds experiment, trial, globals and argv (package scope).
package starlib

import (
	starlarkjson "go.starlark.net/lib/json"
	starlarkmath "go.starlark.net/lib/math"
	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/starlib/courtesy"
	"github.com/memsh/memsh/starlib/cuda"
	"github.com/memsh/memsh/starlib/dist"
	"github.com/memsh/memsh/starlib/gpu"
	"github.com/memsh/memsh/starlib/host"
	memlog "github.com/memsh/memsh/starlib/log"
	"github.com/memsh/memsh/starlib/memtrace"
	"github.com/memsh/memsh/starlib/nn"
	"github.com/memsh/memsh/starlib/numarg"
	"github.com/memsh/memsh/starlib/optim"
	"github.com/memsh/memsh/starlib/profile"
	"github.com/memsh/memsh/starlib/report"
	"github.com/memsh/memsh/starlib/sweep"
	"github.com/memsh/memsh/starlib/tensor"
)

// Predeclared returns a new dict of memsh's session-independent
// predeclared names:
//
//	cuda, tensor, gpu      modules
//	nn, optim              layers and optimizers (PyTorch's torch.nn, torch.optim)
//	math, json             go.starlark.net's math and json modules
//	sweep                  module: max_fit and grid, each point a trial
//	dist                   torch.distributed for one rank of a job (package dist;
//	                       dist.fsdp (FSDP2's fully_shard), dist.deepspeed and
//	                       dist.tensor (tensor parallelism), from package nn)
//	host, log, courtesy    modules (host figures, per-statement logger, courtesy)
//	memtrace, profile, profiled, profile_report, profile_every, report
//	                       the measurement toolkit (packages memtrace,
//	                       profile, report)
//	gc()                   reclaim now; returns the bytes freed
//	budget(bytes, device=None)
//	                       limit the peak allocated bytes of later
//	                       statements and blocks (see Budget)
//	fmt_bytes(n)           "1.50 GiB": IEC units, two decimals
//	KiB MiB GiB TiB        1024, 1024², 1024³, 1024⁴
//
// dist.fsdp, dist.deepspeed and dist.tensor live in package nn (they
// wrap nn.Module values, and nn already imports dist for the process
// group).
func init() {
	// math's and json's functions make new values and change none: a
	// call moves no starlark.Mutations, so that reclaim walks keep the
	// frames and globals they walked (a model's math.sqrt(head_dim) at
	// each attention made every later reclaim walk the globals again)
	for _, m := range []*starlarkstruct.Module{starlarkmath.Module, starlarkjson.Module} {
		for _, v := range m.Members {
			if b, ok := v.(*starlark.Builtin); ok {
				b.DeclarePure()
			}
		}
	}
	dist.Module.Members["fsdp"] = nn.FSDP
	dist.Module.Members["deepspeed"] = nn.DeepSpeed
	dist.Module.Members["tensor"] = nn.TensorParallel
}

func Predeclared() starlark.StringDict {
	return starlark.StringDict{
		"cuda":           cuda.Module,
		"gpu":            gpu.Module,
		"tensor":         tensor.Module,
		"nn":             nn.Module,
		"math":           starlarkmath.Module,
		"json":           starlarkjson.Module,
		"optim":          optim.Module,
		"sweep":          sweep.Module,
		"dist":           dist.Module,
		"gc":             starlark.NewBuiltin("gc", gc),
		"budget":         starlark.NewBuiltin("budget", budgetBuiltin),
		"host":           host.Module,
		"log":            memlog.Module,
		"memtrace":       memtrace.Builtin,
		"profile":        profile.Builtins["profile"],
		"profiled":       profile.Builtins["profiled"],
		"profile_report": profile.Builtins["profile_report"],
		"profile_every":  profile.Builtins["profile_every"],
		"report":         report.Builtin,
		"courtesy":       courtesy.Module,
		"fmt_bytes":      starlark.NewBuiltin("fmt_bytes", fmtBytes),
		"KiB":            starlark.MakeInt64(1 << 10),
		"MiB":            starlark.MakeInt64(1 << 20),
		"GiB":            starlark.MakeInt64(1 << 30),
		"TiB":            starlark.MakeInt64(1 << 40),
	}
}

// gc() runs a reclaim with a full Go GC (Manager.Collect, as Python's
// gc.collect()): every tensor and buffer no value can reach is freed. It
// returns the number of bytes freed. (Memory stays cached by the
// allocator; cuda.empty_cache() releases it to the device.)
func gc(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	return starlark.MakeUint64(e.Manager.Collect().Freed), nil
}

// fmt_bytes(n) formats a byte count with IEC units and two decimals:
// fmt_bytes(1536) == "1.50 KiB", fmt_bytes(512) == "512 B".
func fmtBytes(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var n starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "n", &n); err != nil {
		return nil, err
	}
	i, err := numarg.Int64(b.Name(), "n", n)
	if err != nil {
		return nil, err
	}
	return starlark.String(backend.FormatBytes(i)), nil
}
