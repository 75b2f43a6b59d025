package backend

// Stat type indices, in PyTorch's StatType order.
const (
	statAll   = 0 // "all" (AGGREGATE)
	statSmall = 1 // "small_pool"
	statLarge = 2 // "large_pool"
)

// stat is PyTorch's Stat: current value, peak since the last reset, and the
// cumulative amounts added and removed.
type stat struct {
	current, peak, allocated, freed int64
}

func (s *stat) inc(n int64) {
	s.current += n
	if s.current > s.peak {
		s.peak = s.current
	}
	s.allocated += n
}

func (s *stat) dec(n int64) {
	s.current -= n
	s.freed += n
}

// statArray is one statistic for "all" and each pool.
type statArray [3]stat

// inc adds n to the aggregate and to pool si.
func (s *statArray) inc(si int, n int64) {
	s[statAll].inc(n)
	s[si].inc(n)
}

// dec removes n from the aggregate and from pool si.
func (s *statArray) dec(si int, n int64) {
	s[statAll].dec(n)
	s[si].dec(n)
}

// add applies a net change, as PyTorch does for inactive splits on free: an
// increase if positive, a decrease if negative, nothing if zero.
func (s *statArray) add(si int, n int64) {
	switch {
	case n > 0:
		s.inc(si, n)
	case n < 0:
		s.dec(si, -n)
	}
}

// stats is PyTorch's DeviceStats (without the oversize figures, which stay
// zero with an unlimited max_split_size).
type stats struct {
	allocation         statArray
	segment            statArray
	active             statArray
	inactiveSplit      statArray
	allocatedBytes     statArray
	reservedBytes      statArray
	activeBytes        statArray
	inactiveSplitBytes statArray
	requestedBytes     statArray

	numAllocRetries int64
	numOOMs         int64
	numDeviceAlloc  int64
	numDeviceFree   int64
}

func (s *stats) arrays() [9]*statArray {
	return [9]*statArray{
		&s.allocation, &s.segment, &s.active, &s.inactiveSplit,
		&s.allocatedBytes, &s.reservedBytes, &s.activeBytes,
		&s.inactiveSplitBytes, &s.requestedBytes,
	}
}

// statKeys[k][pool][field] is the memory_stats() key of arrays()[k].
var statKeys = func() (keys [9][3][4]string) {
	names := [9]string{
		"allocation", "segment", "active", "inactive_split",
		"allocated_bytes", "reserved_bytes", "active_bytes",
		"inactive_split_bytes", "requested_bytes",
	}
	pools := [3]string{"all", "small_pool", "large_pool"}
	fields := [4]string{"current", "peak", "allocated", "freed"}
	for k, n := range names {
		for p, pn := range pools {
			for f, fn := range fields {
				keys[k][p][f] = n + "." + pn + "." + fn
			}
		}
	}
	return keys
}()

// Stats returns torch.cuda.memory_stats()'s keys and values: for allocation,
// segment, active, inactive_split, allocated_bytes, reserved_bytes,
// active_bytes, inactive_split_bytes and requested_bytes, each of all,
// small_pool and large_pool with current, peak, allocated and freed; and
// num_alloc_retries, num_ooms, num_device_alloc, num_device_free. As in
// PyTorch's default configuration there are also num_sync_all_streams (0),
// max_split_size (-1: unlimited) and oversize_allocations.* and
// oversize_segments.* (all 0).
func (a *CachingAllocator) Stats() map[string]int64 {
	m := make(map[string]int64, 9*3*4+14)
	for k, arr := range a.st.arrays() {
		for p := range arr {
			s := &arr[p]
			keys := &statKeys[k][p]
			m[keys[0]] = s.current
			m[keys[1]] = s.peak
			m[keys[2]] = s.allocated
			m[keys[3]] = s.freed
		}
	}
	m["num_alloc_retries"] = a.st.numAllocRetries
	m["num_ooms"] = a.st.numOOMs
	m["num_device_alloc"] = a.st.numDeviceAlloc
	m["num_device_free"] = a.st.numDeviceFree
	m["num_sync_all_streams"] = 0
	m["max_split_size"] = -1
	for _, o := range [...]string{"oversize_allocations", "oversize_segments"} {
		for _, f := range [...]string{"current", "peak", "allocated", "freed"} {
			m[o+"."+f] = 0
		}
	}
	return m
}

// ResetPeakStats sets every ".peak" statistic to its current value, as
// torch.cuda.reset_peak_memory_stats. The counters of Peaks are independent
// of it.
func (a *CachingAllocator) ResetPeakStats() {
	for _, arr := range a.st.arrays() {
		for p := range arr {
			arr[p].peak = arr[p].current
		}
	}
}
