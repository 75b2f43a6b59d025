// Package replay records the stream of a trial's device memory events —
// allocations with their requested sizes, frees, reclaims, empty_cache
// calls, device memory taken outside the allocator, kernels' choices by
// shape — and answers a trial at another size by replaying a predicted
// stream through a copy of the device's caching allocator, with no
// Starlark, autograd or reach walk.
//
// A Model is learnt from full trials at several sizes of one searched
// dimension (Fit): when their programs are the same (the same events in
// the same order, the same frees of the same allocations, program.go),
// each allocation's requested bytes are fitted by a polynomial of degree
// at most 2 in the size, in exact integer arithmetic, from three of them
// (or, for a size law, its arguments are) and verified on the others;
// a trial at one more size with a reclaim before every allocation (Dense)
// verifies it again and tells when each allocation became garbage.
// Replay then runs the program the model predicts at a size n, making
// the reclaims the Manager would make, and gives its status (ok or out of
// memory) and the peaks of allocated and reserved bytes; it refuses
// (Unsafe) when what it would report might not be what a full trial
// reports (a reclaim where the recordings cannot tell whether some
// allocation was garbage). docs/architecture.md ("Replay") says why this
// is exact.
package replay

import (
	"fmt"

	"github.com/memsh/memsh/backend"
)

// Kind is the kind of an Op.
type Kind uint8

const (
	Alloc      Kind = iota // allocation ID of Size requested bytes on Dev
	Free                   // free of allocation ID
	Reclaim                // a reclaim pass that freed Count allocations: the Count frees just before it
	EmptyCache             // empty_cache on Dev
	Driver                 // Size bytes of Dev taken outside the allocator (a cuBLAS handle)
	Guard                  // a kernel's choice by shapes: its law's value Size, and Count 1 if the law held
)

func (k Kind) String() string {
	return [...]string{"alloc", "free", "reclaim", "empty_cache", "driver", "guard"}[k]
}

// Host is the Dev of the host allocator's events.
const Host = -1

// Op is one event of a Stream.
type Op struct {
	Kind    Kind
	Trigger backend.Trigger // Reclaim: why it ran
	Dev     int             // GPU ordinal, or Host
	ID      int32           // Alloc, Free: the allocation's number in the trial, from 0
	Count   int32           // Reclaim: the allocations it freed
	Law     int32           // Alloc, Guard: 1 + the index of its size's law in Stream.Laws, or 0
	// Moved (Alloc): the layout clock or the garbage notes moved since the
	// allocation before (or, for the first, since exact mode's last
	// reclaim): something may have become garbage (backend's
	// mayHaveGarbage)
	Moved bool
	// Quiet (Alloc): made in a backend.Manager.Quiet region, where exact
	// mode reclaims for a peak only when something may have become
	// garbage since its last reclaim
	Quiet bool
	Size  uint64 // Alloc: requested bytes; Driver: bytes
}

// LawCall is the law an allocation's size came from, and its arguments
// (backend.Manager.AllocLaw).
type LawCall struct {
	Law  backend.SizeLaw
	Args []int64
}

// same reports whether o and p are the same event but for the sizes.
func (o Op) same(p Op) bool {
	return o.Kind == p.Kind && o.Trigger == p.Trigger && o.Dev == p.Dev && o.ID == p.ID && o.Count == p.Count && o.Law == p.Law && o.Moved == p.Moved && o.Quiet == p.Quiet
}

func (o Op) String() string {
	switch o.Kind {
	case Alloc:
		return fmt.Sprintf("alloc #%d %d B on %d", o.ID, o.Size, o.Dev)
	case Free:
		return fmt.Sprintf("free #%d", o.ID)
	case Reclaim:
		return fmt.Sprintf("reclaim (trigger %d) freeing %d", o.Trigger, o.Count)
	case EmptyCache:
		return fmt.Sprintf("empty_cache on %d", o.Dev)
	case Guard:
		return fmt.Sprintf("guard %d (%v) on %d", o.Size, o.Count == 1, o.Dev)
	}
	return fmt.Sprintf("driver %d B on %d", o.Size, o.Dev)
}

// Stream is what a Recorder recorded of one trial.
type Stream struct {
	// Size is the searched dimension's value of the trial.
	Size int
	// Ops are the events in order.
	Ops []Op
	// Blocks is, per Alloc (by ID), the device address and block size the
	// allocator gave it, to check a replay of the stream against.
	Blocks []Block
	// Laws are the size laws of the allocations that have one (Op.Law).
	Laws []LawCall
	// Segments is the segment allocations and frees, in order, on the
	// GPUs (the check's other half).
	Segments []Segment
	// Peaks is the per-GPU maximum allocated and reserved bytes seen.
	Peaks []Peak
	// OOM is whether an allocation ran out of memory; Retried, whether
	// one was retried after a reclaim (AllocOn's retry).
	OOM, Retried bool
	// Why, if not "", says why the stream cannot be replayed.
	Why string

	start *Start // the GPUs when the recording started
	// progs are its program (programOf), with and without the driver
	// events, once made (program): a search fits its models again after
	// each trial, on every stream recorded so far
	progs [2]*program
}

// program returns the program of s (programOf), without its driver
// events if bare (withoutDrivers), made once: a Stream does not change
// once recorded.
func (s *Stream) program(bare bool) *program {
	i := 0
	if bare {
		i = 1
	}
	if s.progs[i] == nil {
		t := s
		if bare {
			t = withoutDrivers(s)
		}
		s.progs[i] = programOf(t)
	}
	return s.progs[i]
}

// Block is where an allocation was placed.
type Block struct {
	Addr uintptr
	Size uint64
}

// Segment is a segment allocation (Alloc true) or release.
type Segment struct {
	Dev   int
	Alloc bool
	Addr  uintptr
	Size  uint64
}

// Peak is a device's maximum allocated and reserved bytes.
type Peak struct{ Allocated, Reserved uint64 }
