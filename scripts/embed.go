// Package scripts embeds the model library (models/: the builders, *.star,
// and the published configs they are checked against, configs/*.json), so
// that `memsh fit` builds its models, and load("models/....star")
// resolves, from any directory.
package scripts

import "embed"

// Library is the model library alone: its files are "models/NAME.star"
// (and "models/configs/NAME.json"), as load() names them
// (scope.Options.Library).
//
//go:embed models
var Library embed.FS
