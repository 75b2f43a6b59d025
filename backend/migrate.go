package backend

import "fmt"

// HostCopier is implemented by Devices whose memory is not host-accessible
// (a real GPU: Block.Host is nil) to move bytes between device memory and
// host memory, as cuMemcpyDtoH and cuMemcpyHtoD do. Migrate uses it; a
// Device without host access that does not implement it (a meta device)
// stores no data, so there is nothing to copy from it or into it.
type HostCopier interface {
	// CopyToHost copies len(dst) bytes from device address src into dst.
	CopyToHost(dst []byte, src uintptr) error
	// CopyFromHost copies src to device address dst.
	CopyFromHost(dst uintptr, src []byte) error
}

// Migrate moves the allocation behind h to device (a PyTorch device string:
// "cpu", "cuda", "cuda:1"), copying its bytes: a new block is allocated on
// the target, the data copied, and the old block freed. The handle keeps its
// identity and sequence number, so every value sharing the storage (a tensor
// and all its views) follows, and experiments still see the allocation as
// theirs. Migrating to the device the memory is already on does nothing.
//
// The new block is allocated as AllocOn does (exact-peak reclaim, reclaim
// and retry once before an *OOMError), and observers see an alloc event for
// the new block then a free event for the old, both with the handle's
// sequence number. On failure nothing changes. Migrating released memory is
// an error.
func (m *Manager) Migrate(h *Memory, device string) error {
	a, err := m.Allocator(device)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := h.rec
	if r.freed {
		if r.released != "" {
			return fmt.Errorf("memory on %s was %s", r.device, r.released)
		}
		return fmt.Errorf("memory on %s was freed", r.device)
	}
	if a == r.alloc {
		return nil
	}

	if m.sinceReclaim+r.nbytes > m.pacing {
		m.reclaimFor(TriggerAlloc)
	} else if m.peak.Exact() && r.nbytes > 0 && a.Peaks().WouldRaise(a.Allocated()+a.RoundSize(r.nbytes)) {
		m.stats.PeakReclaims++
		m.reclaimFor(TriggerAlloc)
	}
	nb, err := a.TryMalloc(r.nbytes)
	if err != nil && IsOOM(err) {
		m.stats.OOMRetries++
		m.reclaimFor(TriggerOOM)
		nb, err = a.Malloc(r.nbytes)
	}
	if err != nil {
		if IsOOM(err) {
			m.emit(a, Event{Kind: EventOOM, Size: r.nbytes, Requested: r.nbytes})
		}
		return err
	}
	m.sinceReclaim += r.nbytes
	m.emit(a, Event{Kind: EventAlloc, Addr: nb.Ptr, Size: nb.Size, Requested: r.nbytes, Seq: r.seq})

	if err := copyBlock(a.Device(), nb, r.alloc.Device(), r.block, r.nbytes); err != nil {
		a.Free(nb)
		m.emit(a, Event{Kind: EventFree, Addr: nb.Ptr, Size: nb.Size, Requested: r.nbytes, Seq: r.seq})
		return fmt.Errorf("moving %s from %s to %s: %w", FormatSize(r.nbytes), r.device, a.Device().Name(), err)
	}

	old, oldAlloc := r.block, r.alloc
	r.alloc, r.block, r.device = a, nb, a.Device().Name()
	addr, size := old.Ptr, old.Size
	oldAlloc.Free(old)
	m.emit(oldAlloc, Event{Kind: EventFree, Addr: addr, Size: size, Requested: r.nbytes, Seq: r.seq})
	return nil
}

// copyBlock copies n bytes from block src on device sd to block dst on
// device dd, through host views where the devices have them, otherwise
// through a HostCopier (with a bounce buffer between two devices without
// host access). A source that stores no data leaves the target zeroed.
func copyBlock(dd Device, dst *Block, sd Device, src *Block, n uint64) error {
	if n == 0 {
		return nil
	}
	dc, dCopier := dd.(HostCopier)
	sc, sCopier := sd.(HostCopier)
	var data []byte
	switch {
	case src.Host != nil:
		data = src.Host[:n]
	case sCopier:
		if dst.Host != nil {
			return sc.CopyToHost(dst.Host[:n], src.Ptr)
		}
		data = make([]byte, n)
		if err := sc.CopyToHost(data, src.Ptr); err != nil {
			return err
		}
	}
	switch {
	case dst.Host != nil:
		if data == nil {
			clear(dst.Host[:n])
			return nil
		}
		copy(dst.Host[:n], data)
		return nil
	case dCopier:
		if data == nil {
			data = make([]byte, n)
		}
		return dc.CopyFromHost(dst.Ptr, data)
	}
	return nil // the target stores no data (meta)
}
