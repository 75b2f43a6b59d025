package profile

import (
	"fmt"
	"sort"
	"strings"

	"github.com/memsh/memsh/backend"
)

// The statistics a line accumulates, each for all pools, the small pool
// and the large pool (PyTorch's memory_stats() names; active_bytes and
// active are allocated_bytes and allocation, as memsh frees blocks at once).
const (
	sAllocatedBytes = iota
	sReservedBytes
	sRequestedBytes
	sAllocation
	sSegment
	nStat
)

const (
	pAll = iota
	pSmall
	pLarge
	nPool
)

// Fields of a statistic, as columns: the level after the line's last
// event, the highest level after an allocation in the line, and the sums
// of increases and decreases during the line.
const (
	fCurrent = iota
	fPeak
	fAllocated
	fFreed
)

var statNames = map[string]int{
	"allocated_bytes": sAllocatedBytes,
	"active_bytes":    sAllocatedBytes,
	"reserved_bytes":  sReservedBytes,
	"requested_bytes": sRequestedBytes,
	"allocation":      sAllocation,
	"active":          sAllocation,
	"segment":         sSegment,
}

var poolNames = map[string]int{"all": pAll, "small_pool": pSmall, "large_pool": pLarge}

var fieldNames = map[string]int{"current": fCurrent, "peak": fPeak, "allocated": fAllocated, "freed": fFreed}

// scalar columns
const (
	scNone = iota
	scOOMs
	scDeviceAlloc
	scDeviceFree
)

var scalarNames = map[string]int{"num_ooms": scOOMs, "num_device_alloc": scDeviceAlloc, "num_device_free": scDeviceFree}

// column is one selectable column: a cuda.memory_stats() key.
type column struct {
	key               string
	stat, pool, field int
	scalar            int
	bytes             bool
}

// DefaultColumns are the columns of a table when none are chosen:
// pytorch_memlab's two (peak active and peak reserved bytes) and the bytes
// and number of allocations made by the line.
var DefaultColumns = []string{"active_bytes.all.peak", "reserved_bytes.all.peak", "allocated_bytes.all.allocated", "allocation.all.allocated"}

// parseColumn resolves a memory_stats() key.
func parseColumn(key string) (column, error) {
	if sc, ok := scalarNames[key]; ok {
		return column{key: key, scalar: sc}, nil
	}
	parts := strings.Split(key, ".")
	if len(parts) == 3 {
		s, ok1 := statNames[parts[0]]
		p, ok2 := poolNames[parts[1]]
		f, ok3 := fieldNames[parts[2]]
		if ok1 && ok2 && ok3 {
			return column{key: key, stat: s, pool: p, field: f, bytes: strings.HasSuffix(parts[0], "_bytes")}, nil
		}
	}
	return column{}, fmt.Errorf("%q is not a memory_stats() key that can be attributed to lines (want %s)", key, supported())
}

func supported() string {
	var stats []string
	for k := range statNames {
		stats = append(stats, k)
	}
	sort.Strings(stats)
	return "{" + strings.Join(stats, ",") + "}.{all,small_pool,large_pool}.{current,peak,allocated,freed}, num_ooms, num_device_alloc or num_device_free"
}

// headers returns the key split at dots, for the three header rows.
func (c column) headers() [3]string {
	var h [3]string
	copy(h[:], strings.SplitN(c.key, ".", 3))
	return h
}

// value returns the column's figure in a line's accumulator.
func (c column) value(a *acc) int64 {
	switch c.scalar {
	case scOOMs:
		return a.ooms
	case scDeviceAlloc:
		return a.inc[sSegment][pAll]
	case scDeviceFree:
		return a.dec[sSegment][pAll]
	}
	switch c.field {
	case fCurrent:
		return a.cur[c.stat][c.pool]
	case fPeak:
		return a.peak[c.stat][c.pool]
	case fAllocated:
		return a.inc[c.stat][c.pool]
	}
	return a.dec[c.stat][c.pool]
}

func (c column) format(v int64) string {
	if c.bytes {
		return backend.FormatBytes(v)
	}
	return fmt.Sprint(v)
}

// levels are the current values of every statistic on one device.
type levels [nStat][nPool]int64

// acc accumulates one line's figures on one device.
type acc struct {
	cur, peak, inc, dec levels
	ooms                int64
	allocs              bool // an allocation was attributed (peak is meaningful)
}

// merge keeps the maximum of every figure (maxima across calls).
func (a *acc) merge(b *acc) {
	for s := range nStat {
		for p := range nPool {
			a.cur[s][p] = max(a.cur[s][p], b.cur[s][p])
			a.peak[s][p] = max(a.peak[s][p], b.peak[s][p])
			a.inc[s][p] = max(a.inc[s][p], b.inc[s][p])
			a.dec[s][p] = max(a.dec[s][p], b.dec[s][p])
		}
	}
	a.ooms = max(a.ooms, b.ooms)
	a.allocs = a.allocs || b.allocs
}

// initLevels reads a device's current statistics.
func initLevels(a backend.Allocator) *levels {
	st := a.Stats()
	var l levels
	names := [nStat]string{"allocated_bytes", "reserved_bytes", "requested_bytes", "allocation", "segment"}
	pools := [nPool]string{"all", "small_pool", "large_pool"}
	for s, n := range names {
		for p, pn := range pools {
			l[s][p] = st[n+"."+pn+".current"]
		}
	}
	return &l
}
