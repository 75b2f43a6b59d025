// Package scripts embeds the main job (fit.star) and the model library
// (models/: the builders, *.star, and the published configs they are
// checked against, configs/*.json) so that `memsh fit` runs them, and
// load("models/....star") resolves, from any directory.
package scripts

import "embed"

// FS holds fit.star and the model library.
//
//go:embed fit.star models
var FS embed.FS

// Library is the model library alone: its files are "models/NAME.star"
// (and "models/configs/NAME.json"), as load() names them
// (scope.Options.Library).
//
//go:embed models
var Library embed.FS
