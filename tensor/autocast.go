package tensor

import "weak"

// AutocastState is a Context's torch.autocast("cuda") state, kept here so
// that every op of the Context sees it; package tensor/autograd applies
// it (autocast.go there: the op lists and the casts) and the binding
// (nn.autocast) sets it.
type AutocastState struct {
	// Enabled is torch.is_autocast_enabled("cuda").
	Enabled bool
	// DType is the lower-precision dtype (torch.get_autocast_dtype("cuda")):
	// Float16 or BFloat16.
	DType DType
	// Nesting counts the autocast regions entered and not left
	// (autocast_increment_nesting); leaving the outermost clears Cache.
	Nesting int
	// Excluded is set while a listed op's autocast wrapper runs the op
	// (PyTorch's ExcludeDispatchKeyGuard on AutocastFunctionality): the
	// ops it calls inside do not cast again.
	Excluded bool
	// CacheEnabled is torch.is_autocast_cache_enabled().
	CacheEnabled bool
	// Cache maps a float32 leaf that requires grad (a parameter) to its
	// lower-precision cast, as at::autocast's cached_casts: keyed weakly
	// (PyTorch keys by TensorImpl* and keeps a weak reference), the cast
	// held strongly until the outermost region is left.
	Cache map[weak.Pointer[Tensor]]*Tensor
	// Owner identifies the frame of the call that entered the outermost
	// region, when the layer above says (nn.autocast: its built-in
	// frame's stamp), 0 otherwise: the reach walk credits the casts to
	// that frame (scope's frameCache).
	Owner uint64
	// casts are Cache's casts in the order they were made, and gen counts
	// the times Cache was cleared (Casts)
	casts []*Tensor
	gen   uint64
}

// AddCast puts c, the cast of t, in the cache.
func (st *AutocastState) AddCast(key weak.Pointer[Tensor], c *Tensor) {
	if st.Cache == nil {
		st.Cache = map[weak.Pointer[Tensor]]*Tensor{}
	}
	st.Cache[key] = c
	st.casts = append(st.casts, c)
}

// ClearCache empties the cache (the outermost autocast region is left).
func (st *AutocastState) ClearCache() {
	clear(st.Cache)
	clear(st.casts)
	st.casts = st.casts[:0]
	st.gen++
}

// Casts returns the casts c's autocast cache holds, in the order they
// were made, the number of times it was cleared — while that number
// stands, the cache has only grown, and the casts a walk met are a prefix
// of those it holds — and its Owner. The caller must not change the
// slice.
func Casts(c *Context) (casts []*Tensor, gen, owner uint64) {
	if c == nil || c.Autocast == nil {
		return nil, 0, 0
	}
	return c.Autocast.casts, c.Autocast.gen, c.Autocast.Owner
}

// AutocastOf returns c's autocast state, creating it (disabled) on first
// use.
func (c *Context) AutocastOf() *AutocastState {
	if c.Autocast == nil {
		c.Autocast = &AutocastState{DType: Float16, CacheEnabled: true}
	}
	return c.Autocast
}
