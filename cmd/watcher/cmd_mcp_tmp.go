package main

// TEMPORARY (branch h-mcpwrap only): `watcher mcp wrap` until the `watcher
// mcp` dispatcher of cmd_mcp.go (branch h-mcp) is merged; delete this file
// then.

import (
	"context"
	"errors"
	"io"
	"os"
)

func init() {
	register("mcp", command{Summary: "MCP: wrap a third-party MCP server in a sandbox (watcher mcp wrap)", Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		if len(args) == 0 || args[0] != "wrap" {
			return &exitError{Code: 2, Err: errors.New("usage: watcher mcp wrap ...")}
		}
		if code := runMCPWrap(args[1:]); code != 0 {
			os.Exit(code) // runMCPWrap printed the error
		}
		return nil
	}})
}
