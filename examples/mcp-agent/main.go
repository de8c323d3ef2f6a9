// Command mcp-agent is the example agent loop of examples/go-agent over
// MCP, with the official Go SDK's client and no code of watcher's: it
// spawns `watcher mcp serve` (stdio), lists the sandbox's tools and
// replays a fixed plan, printing each result (a refusal is a result with
// isError whose text says what was refused and what would allow it).
//
//	go run ./examples/mcp-agent -- sudo watcher mcp serve --sandbox agents
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var plan = []struct {
	tool string
	args map[string]any
}{
	{"list_dir", map[string]any{"path": "."}},
	{"read_file", map[string]any{"path": "README"}},
	{"write_file", map[string]any{"path": "notes.txt", "content": "summary: the README says hello\n"}},
	{"shell", map[string]any{"command": "wc -c README; cat /etc/shadow"}},
	{"read_file", map[string]any{"path": "../../etc/passwd"}},
	{"http_fetch", map[string]any{"url": "https://example.com"}},
}

func main() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: mcp-agent [--] COMMAND ARGS (the MCP server to spawn, e.g. watcher mcp serve)")
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(context.Background(), flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "mcp-agent:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, server []string) error {
	client := mcp.NewClient(&mcp.Implementation{Name: "watcher-example-mcp-agent", Version: "1.0"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: exec.Command(server[0], server[1:]...)}, nil)
	if err != nil {
		return err
	}
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		return err
	}
	var names []string
	for _, t := range tools.Tools {
		names = append(names, t.Name)
	}
	fmt.Printf("tools: %s\n", strings.Join(names, ", "))
	for i, s := range plan {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: s.tool, Arguments: s.args})
		if err != nil {
			return fmt.Errorf("%s: %w", s.tool, err)
		}
		var text strings.Builder
		for _, c := range res.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				text.WriteString(t.Text)
			}
		}
		status := "ok"
		if res.IsError {
			status = "isError"
		}
		fmt.Printf("%d %s (%s, call %v):\n  %s\n", i+1, s.tool, status, res.Meta["watcher/call_id"],
			strings.ReplaceAll(strings.TrimSpace(text.String()), "\n", "\n  "))
	}
	return nil
}
