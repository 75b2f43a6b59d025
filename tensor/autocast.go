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
}

// AutocastOf returns c's autocast state, creating it (disabled) on first
// use.
func (c *Context) AutocastOf() *AutocastState {
	if c.Autocast == nil {
		c.Autocast = &AutocastState{DType: Float16, CacheEnabled: true}
	}
	return c.Autocast
}
