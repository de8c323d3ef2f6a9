package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/watcherhq/watcher/internal/textesc"
)

func init() {
	register("mcp", command{Summary: "speak MCP: serve a sandbox's tools (serve), cage an MCP server (wrap)", Run: runMCP})
}

const mcpUsage = `Usage: watcher mcp serve [flags]          a sandbox's tool gateway as an MCP server (stdio or loopback HTTP)
       watcher mcp wrap [flags] -- CMD ARGS  an MCP server run in a sandbox of its own

Run 'watcher mcp serve --help' or 'watcher mcp wrap --help' for their flags.
See docs/concepts/mcp.md.`

func runMCP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stderr, mcpUsage)
		if len(args) == 0 {
			return &exitError{Code: 2, Err: errors.New("mcp: no subcommand given (serve or wrap)")}
		}
		return nil
	}
	switch args[0] {
	case "serve":
		return runMCPServe(ctx, args[1:], stdout, stderr)
	case "wrap":
		if code := runMCPWrap(args[1:]); code != 0 {
			return &exitError{Code: code, Err: errReported} // wrap printed its error
		}
		return nil
	}
	fmt.Fprintln(stderr, mcpUsage)
	return &exitError{Code: 2, Err: fmt.Errorf("mcp: unknown subcommand %s (serve or wrap)", "\""+textesc.String(args[0])+"\"")}
}
