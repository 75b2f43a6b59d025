// Package scripts embeds the main job (fit.star) and the model library
// (models/*.star) so that `memsh fit` runs them from any directory.
package scripts

import "embed"

// FS holds fit.star and models/*.star.
//
//go:embed fit.star models/*.star
var FS embed.FS
