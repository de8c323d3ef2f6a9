// Command watcher is the host agent that cages AI agents with kernel-enforced
// policy and keeps a tamper-evident record of what they did.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/textesc"
)

// command is one `watcher` subcommand. Each lives in its own cmd_*.go file
// and registers itself in commands from an init function.
type command struct {
	// Summary is the one-line description shown by `watcher help`.
	Summary string
	// Run executes the subcommand with the arguments after its name.
	Run func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{}

func register(name string, c command) {
	if _, dup := commands[name]; dup {
		panic("duplicate command " + name)
	}
	commands[name] = c
}

// exitError carries a specific exit code out of run (e.g. verify: 1 tampered,
// 2 unreadable).
type exitError struct {
	Code int
	Err  error
}

func (e *exitError) Error() string { return e.Err.Error() }
func (e *exitError) Unwrap() error { return e.Err }

func main() {
	// In a process re-executed by `watcher exec`, apply the sandbox's
	// seccomp and Landlock restrictions and exec the command; never returns
	// there. Elsewhere it returns at once.
	launch.Init()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		code := 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.Code
		}
		switch {
		case errors.Is(err, errHelpShown):
			code = 0
		case errors.Is(err, errReported):
		default:
			fmt.Fprintln(os.Stderr, errorText(err))
		}
		os.Exit(code)
	}
}

var errHelpShown = errors.New("help shown")

// errReported: the command printed its error itself; only its exit code
// remains to give.
var errReported = errors.New("error already reported")

// errorText is how main prints an error: on one line, escaped for the
// terminal, as it may quote a path or a name a sandbox chose (a cgroup
// lacking hardening, a failed canary probe, a file a rollback could not
// remove). The parts of a joined error show as \n.
func errorText(err error) string {
	return "watcher: " + textesc.String(err.Error())
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok {
				return c.Run(ctx, []string{"--help"}, stdout, stderr)
			}
		}
		usage(stdout)
		if len(args) == 0 {
			return &exitError{Code: 2, Err: errors.New("no command given")}
		}
		return nil
	}
	c, ok := commands[args[0]]
	if !ok {
		usage(stderr)
		return &exitError{Code: 2, Err: fmt.Errorf("unknown command %q", args[0])}
	}
	return c.Run(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "watcher: a kernel-enforced cage and tamper-evident record for AI agents")
	fmt.Fprintln(w, "\nUsage: watcher COMMAND [flags] [args]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	width := 0
	for _, n := range names {
		width = max(width, len(n))
	}
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, commands[n].Summary)
	}
	fmt.Fprintln(w, "\nRun 'watcher COMMAND --help' for a command's flags.")
}
