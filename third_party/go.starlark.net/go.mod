module go.starlark.net

go 1.25.0

require (
	github.com/chzyer/readline v1.5.1
	github.com/google/go-cmp v0.7.0
	golang.org/x/sys v0.42.0
	golang.org/x/term v0.41.0
	google.golang.org/protobuf v1.36.11
)
