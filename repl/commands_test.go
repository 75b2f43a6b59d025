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
		">>> :log off\nlog is off\n>>> z = 1\n>>> :log bogus\nusage: :log on|compact|off, :log seed N|off, :log perf [EVENT...|off]\n>>> :log on off\nusage: :log on|compact|off, :log seed N|off, :log perf [EVENT...|off]\n",
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

func TestLogSeedCommand(t *testing.T) {
	got := transcript(t, `:log seed 7
:log compact
a = tensor.rand([4]).tolist()
b = tensor.rand([4]).tolist()
:log seed off
c = tensor.rand([4]).tolist()
d = tensor.rand([4]).tolist()
:log off
print(a == b, c == d)
:log seed
:log seed x
:log seed 0x10
:log
`)
	for _, want := range []string{
		">>> :log seed 7\nlog is off, seed 7 (the seed applies while the log is on: :log on)\n",
		">>> :log compact\nlog is compact, seed 7\n",
		">>> :log seed off\nlog is compact\n",
		"True False\n",
		">>> :log seed\nusage: :log seed N|off\n",
		">>> :log seed x\n:log seed: \"x\" is not an integer (usage: :log seed N|off)\n",
		">>> :log seed 0x10\nlog is off, seed 16 (",
		">>> :log\nlog is off, seed 16\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("transcript lacks %q:\n%s", want, got)
		}
	}
}

func TestLogPerfCommand(t *testing.T) {
	got := transcript(t, `:log perf no-such-event
:log perf task-clock page-faults
x = tensor.zeros([1024, 1024], device="cpu")
:log perf off
:log perf off
:log off
:log perf off
`)
	if !strings.Contains(got, ">>> :log perf no-such-event\n:log perf: unknown perf event \"no-such-event\"") {
		t.Errorf("unknown event:\n%s", got)
	}
	// Counters may be refused (perf_event_paranoid, containers): then the
	// error says so and the log stays off.
	if strings.Contains(got, ">>> :log perf task-clock page-faults\n:log perf: ") {
		if !strings.Contains(got, "perf_event_paranoid") || !strings.Contains(got, ">>> :log off\nlog is off\n") {
			t.Errorf("refused counters:\n%s", got)
		}
		t.Skip("perf counters refused here")
	}
	for _, want := range []string{
		">>> :log perf task-clock page-faults\nlog is on, perf task-clock page-faults\n",
		"task-clock",
		">>> :log perf off\nlog is on\n>>> :log perf off\nlog is on\n",
		">>> :log off\nlog is off\n>>> :log perf off\nlog is off\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("transcript lacks %q:\n%s", want, got)
		}
	}
}

func TestHelpListsLogCommands(t *testing.T) {
	got := transcript(t, ":help\n")
	for _, want := range []string{"  :log seed N|off ", "  :log perf [EVENT...] "} {
		if !strings.Contains(got, want) {
			t.Errorf(":help lacks %q:\n%s", want, got)
		}
	}
}
