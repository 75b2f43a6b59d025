package cuda

import "github.com/memsh/memsh/env"

// Reach reports the buffer's memory, for the reclaim proof (env.Walker).
func (b *Buffer) Reach(w *env.Walker) { w.Memory(b.mem) }
