package repl_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/memsh/memsh/repl"
	"github.com/memsh/memsh/scope"
)

func transcript(t *testing.T, input string) string {
	t.Helper()
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := repl.Loop(s, repl.NewPlain(strings.NewReader(input), &out), &out); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestLogCommand(t *testing.T) {
	got := transcript(t, `:log
:log compact
x = tensor.zeros([16, 1024, 1024], device="cuda")
:log on
y = tensor.zeros([4, 1024, 1024], device="cuda").numel()
:log off
z = 1
:log bogus
:log on off
`)
	for _, want := range []string{
		">>> :log\nlog is off\n",
		">>> :log compact\nlog is compact\n",
		"cuda:0: 64.00 MiB/0 B/64.00 MiB | Time 0:00:",
		">>> :log on\nlog is on\n",
		"･ cuda:0:          0 B   16.00 MiB   64.00 MiB |\n",
		">>> :log off\nlog is off\n>>> z = 1\n>>> :log bogus\nusage: :log on|compact|off\n>>> :log on off\nusage: :log on|compact|off\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("transcript lacks %q:\n%s", want, got)
		}
	}
	// REPL inputs carry no position in the log lines.
	if strings.Contains(got, "<stdin>") {
		t.Errorf("log lines name <stdin>:\n%s", got)
	}
}

func TestStatsCommand(t *testing.T) {
	got := transcript(t, `x = tensor.zeros([16, 1024, 1024], device="cuda")
:stats
:stats summary
:stats bogus
:help
`)
	for _, want := range []string{
		"Device      Allocated     Reserved   Peak alloc    Peak resv         Free        Total\n",
		"cuda:0      64.00 MiB    64.00 MiB    64.00 MiB    64.00 MiB   960.00 MiB     1.00 GiB\n",
		"host RSS ",
		"reclaims: ",
		"peak mode exact\n",
		"|                  memsh CUDA memory summary, device ID 0                   |\n",
		"| Allocated memory      |  65536 KiB |  65536 KiB |  65536 KiB |      0 B   |\n",
		">>> :stats bogus\nusage: :stats [summary]\n",
		"  :log on|compact|off    log memory, time and CPU after every input\n",
		"  :stats [summary]       memory figures now",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("transcript lacks %q:\n%s", want, got)
		}
	}
}
