// Command go-agent is an example agent loop over watcher's tool gateway. A
// real agent asks its model for the next call; this one replays a fixed
// plan: list, read, write, a shell command, and calls the policy refuses.
// After a crash it resumes where it left off (session.resume).
//
//	go run ./examples/go-agent -socket /run/watcher/sandboxes/agents/tools.sock
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/watcherhq/watcher/pkg/toolclient"
)

type step struct {
	tool string
	args map[string]any
}

var plan = []step{
	{"list_dir", map[string]any{"path": "."}},
	{"read_file", map[string]any{"path": "README"}},
	{"write_file", map[string]any{"path": "notes.txt", "content": "summary: the README says hello\n"}},
	{"shell", map[string]any{"command": "wc -c notes.txt && cat /etc/shadow"}},
	{"read_file", map[string]any{"path": "../../etc/passwd"}},
	{"http_fetch", map[string]any{"url": "https://example.com"}},
}

func main() {
	socket := flag.String("socket", "/run/watcher/sandboxes/agents/tools.sock", "the sandbox's gateway socket")
	session := flag.String("session", "example-go", "session name (call ids are SESSION-N)")
	shell := flag.String("shell", "", "run this one shell command through the gateway instead of the plan")
	flag.Parse()
	var err error
	if *shell != "" {
		err = runShell(context.Background(), *socket, *session, *shell)
	} else {
		err = run(context.Background(), *socket, *session)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-agent:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, socket, session string) error {
	c, err := toolclient.Dial(socket)
	if err != nil {
		return err
	}
	defer c.Close()
	c.Session = session
	tools, err := c.List(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("sandbox %s tools: %v\n", tools.Sandbox, tools.Tools)
	acts, _, err := c.Resume(ctx, 0)
	if err != nil {
		return err
	}
	done := map[string]bool{}
	for _, a := range acts {
		done[a.CallID] = true
	}
	for i, s := range plan {
		id := fmt.Sprintf("%s-%d", session, i+1)
		if done[id] {
			fmt.Printf("%s %s: done before the restart, skipped\n", id, s.tool)
			continue
		}
		switch s.tool {
		case "shell":
			out, err := c.Shell(ctx, id, s.args["command"].(string), 0)
			if report(id, s.tool, err) {
				fmt.Printf("%s shell: exit %d stdout %q\n", id, out.ExitCode, out.Stdout)
				if out.RefusalSummary != "" {
					fmt.Printf("    refused by the kernel: %s\n", out.RefusalSummary)
				}
			}
		default:
			var out map[string]any
			_, err := c.Call(ctx, id, s.tool, s.args, &out)
			if report(id, s.tool, err) {
				fmt.Printf("%s %s: %v\n", id, s.tool, out)
			}
		}
	}
	return nil
}

// runShell runs one command and prints its output.
func runShell(ctx context.Context, socket, session, command string) error {
	c, err := toolclient.Dial(socket)
	if err != nil {
		return err
	}
	defer c.Close()
	c.Session = session
	out, err := c.Shell(ctx, session+"-shell", command, 0)
	if err != nil {
		return err
	}
	fmt.Print(out.Stdout)
	fmt.Fprint(os.Stderr, out.Stderr)
	if out.RefusalSummary != "" {
		fmt.Fprintln(os.Stderr, "refused by the kernel:", out.RefusalSummary)
	}
	if out.ExitCode != 0 {
		return fmt.Errorf("exit %d", out.ExitCode)
	}
	return nil
}

// report prints a refusal (what and why, for the model) and says whether
// the call succeeded.
func report(id, tool string, err error) bool {
	var te *toolclient.Error
	switch {
	case err == nil:
		return true
	case errors.As(err, &te):
		fmt.Printf("%s %s: REFUSED %s: %s\n", id, tool, te.Type(), te.Message)
	default:
		fmt.Printf("%s %s: error: %v\n", id, tool, err)
	}
	return false
}
