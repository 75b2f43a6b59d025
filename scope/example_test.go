package scope_test

import (
	"fmt"
	"io"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
)

// An embedding Go program creates a Session on a simulated GPU, runs
// Starlark in it and reads an experiment's figures as Go values.
func Example() {
	s, err := scope.New(scope.Options{Device: "sim:16GiB", Out: io.Discard})
	if err != nil {
		panic(err)
	}
	defer s.Close()

	err = s.Exec("example.star", `
e = experiment("bs=64")
x = tensor.zeros([64, 1024, 1024], device="cuda")
tmp = tensor.ones([32, 1024, 1024], device="cuda")
tmp = None
e.finish()
`)
	if err != nil {
		panic(err)
	}
	e := s.Get("e").(*scope.Experiment)
	d := e.Result()
	fmt.Println(d.Name, d.GPU.Device)
	fmt.Println("consumed:", backend.FormatBytes(d.GPU.Consumed))
	fmt.Println("peaked:", backend.FormatBytes(d.GPU.Peaked))
	fmt.Println("reclaimed:", backend.FormatBytes(d.GPU.Reclaimed))
	fmt.Println("deleted:", e.Outcome().Deleted)
	fmt.Println("x still bound:", s.Get("x") != nil)
	// Output:
	// bs=64 cuda:0
	// consumed: 256.00 MiB
	// peaked: 128.00 MiB
	// reclaimed: 256.00 MiB
	// deleted: [tmp x]
	// x still bound: false
}
