package record

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Merge combines the records of several files — the shards of one run, or
// a run and its resumptions — into what one unsharded, uninterrupted run
// writes: records with the same position and identity (kind, name, sweep,
// parameters) are one record, the last one read winning (a resumed run's
// re-run of a block replaces the older copy) unless it is an "error" and an
// earlier one is not; the result is ordered by
// position, ties keeping the order read.
func Merge(sets ...[]*Record) []*Record {
	index := map[string]int{}
	var out []*Record
	for _, recs := range sets {
		for _, r := range recs {
			id := r.identity()
			if i, ok := index[id]; ok {
				// A later copy wins (a resumed re-run), except that an
				// error never replaces a measured result: a shard that did
				// not run a sweep may fail code that uses its result.
				if r.Status != "error" || out[i].Status == "error" {
					out[i] = r
				}
				continue
			}
			index[id] = len(out)
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b *Record) int {
		switch {
		case a.Pos.Less(b.Pos):
			return -1
		case b.Pos.Less(a.Pos):
			return 1
		}
		return 0
	})
	return out
}

// Shard selects a deterministic subset of sweep units: unit u belongs to
// shard u mod Count. The zero Shard (Count 0) runs everything.
type Shard struct {
	Index, Count int
}

// ParseShard parses "i/n" with 0 <= i < n (the form of --shard; Slurm's
// $SLURM_ARRAY_TASK_ID with --array=0-(n-1), or a Kubernetes Indexed Job's
// $JOB_COMPLETION_INDEX).
func ParseShard(s string) (Shard, error) {
	i, n, ok := strings.Cut(s, "/")
	if !ok {
		return Shard{}, fmt.Errorf("bad shard %q: want i/n, e.g. 0/4", s)
	}
	idx, err1 := strconv.Atoi(strings.TrimSpace(i))
	cnt, err2 := strconv.Atoi(strings.TrimSpace(n))
	if err1 != nil || err2 != nil {
		return Shard{}, fmt.Errorf("bad shard %q: want i/n with integers, e.g. 0/4", s)
	}
	if cnt < 1 || idx < 0 || idx >= cnt {
		return Shard{}, fmt.Errorf("bad shard %q: want 0 <= i < n", s)
	}
	return Shard{Index: idx, Count: cnt}, nil
}

// Sharded reports whether the shard runs only part of the units.
func (s Shard) Sharded() bool { return s.Count > 1 }

// Owns reports whether unit u runs on this shard.
func (s Shard) Owns(u int) bool { return s.Count <= 1 || u%s.Count == s.Index }

// String returns "i/n", or "" for the zero Shard.
func (s Shard) String() string {
	if s.Count == 0 {
		return ""
	}
	return fmt.Sprintf("%d/%d", s.Index, s.Count)
}
