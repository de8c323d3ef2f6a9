package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/gateway"
	"github.com/watcherhq/watcher/internal/mcpserve"
	"github.com/watcherhq/watcher/internal/textesc"
)

func runMCPServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mcp serve", flag.ContinueOnError)
	sandbox := fs.String("sandbox", "", "the sandbox whose tools to serve (default: the only sandbox with a gateway)")
	socketDir := fs.String("socket-dir", filepath.Dir(control.DefaultSocket), "the agent's socket directory")
	socket := fs.String("socket", "", "the sandbox's gateway socket (default SOCKET_DIR/sandboxes/SANDBOX/tools.sock)")
	httpAddr := fs.String("http", "", "serve Streamable HTTP on this loopback `ADDR` (127.0.0.1:PORT) instead of stdio, with a bearer token")
	tokenFile := fs.String("token-file", "", "with --http: the bearer token is this file's content (default: $WATCHER_MCP_TOKEN, else a new one, printed on stderr)")
	if err := parseFlags(fs, args, stderr, `Usage: watcher mcp serve [--sandbox S] [--http 127.0.0.1:PORT [--token-file F]]

Serves a sandbox's tool gateway as an MCP server. The agent (watcher run)
serves MCP's Streamable HTTP on the sandbox's gateway socket; this command
relays an MCP client's stdio to it (for clients that spawn their servers),
or with --http serves it on a loopback port that asks for a bearer token.

Every tools/call goes through the gateway's decision path (the policy's tool
rules, approvals, the kernel's path checks, watcher exec for shell) and is
recorded in the ledger with the MCP session and request id. A refused call
is a tool result with isError whose text says what was refused, by which
rule and layer, and which policy lines would allow it. See docs/concepts/mcp.md.

In a client's configuration (.mcp.json, claude_desktop_config.json):
  {"mcpServers": {"watcher": {"command": "sudo", "args": ["watcher", "mcp", "serve"]}}}`); err != nil {
		return helpOK(err)
	}
	if fs.NArg() != 0 {
		return &exitError{Code: 2, Err: fmt.Errorf("mcp serve takes no arguments (got %s)", textesc.String(strings.Join(fs.Args(), " ")))}
	}
	path := *socket
	if path == "" {
		name, err := mcpSandbox(*socketDir, *sandbox)
		if err != nil {
			return err
		}
		path = gateway.SocketPath(*socketDir, name)
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("mcp serve: the gateway socket %s: %w (is `watcher run` running, with tools enabled for the sandbox?)", path, err)
	}
	client := mcpserve.SocketClient(path)
	if *httpAddr == "" {
		err := mcpserve.Relay(ctx, os.Stdin, stdout, client, mcpserve.SocketURL)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
	token, err := bearerToken(*tokenFile)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return fmt.Errorf("mcp serve: %w", err)
	}
	if a, ok := ln.Addr().(*net.TCPAddr); !ok || !a.IP.IsLoopback() {
		ln.Close()
		return &exitError{Code: 2, Err: fmt.Errorf("mcp serve: --http %s is not a loopback address (127.0.0.1 or [::1])", textesc.String(*httpAddr))}
	}
	fmt.Fprintf(stderr, "watcher mcp serve: MCP endpoint http://%s%s for %s\n", ln.Addr(), mcpserve.Path, path)
	if *tokenFile == "" && os.Getenv("WATCHER_MCP_TOKEN") == "" {
		fmt.Fprintf(stderr, "watcher mcp serve: bearer token %s (send Authorization: Bearer TOKEN)\n", token)
	}
	return mcpserve.Loopback(ctx, ln, token, client)
}

// mcpSandbox is the sandbox named, or the only one whose gateway socket
// is in the socket directory.
func mcpSandbox(socketDir, name string) (string, error) {
	if name != "" {
		return name, nil
	}
	socks, _ := filepath.Glob(filepath.Join(socketDir, "sandboxes", "*", "tools.sock"))
	switch len(socks) {
	case 0:
		return "", fmt.Errorf("mcp serve: no gateway socket under %s (is `watcher run` running, with tools enabled for a sandbox?)", filepath.Join(socketDir, "sandboxes"))
	case 1:
		return filepath.Base(filepath.Dir(socks[0])), nil
	}
	var names []string
	for _, s := range socks {
		names = append(names, filepath.Base(filepath.Dir(s)))
	}
	return "", &exitError{Code: 2, Err: fmt.Errorf("mcp serve: several sandboxes serve tools (%s): name one with --sandbox", textesc.String(strings.Join(names, ", ")))}
}

func bearerToken(file string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("mcp serve: token file: %w", err)
		}
		t := strings.TrimSpace(string(b))
		if len(t) < 16 {
			return "", fmt.Errorf("mcp serve: the token in %s is shorter than 16 characters", file)
		}
		return t, nil
	}
	if t := strings.TrimSpace(os.Getenv("WATCHER_MCP_TOKEN")); t != "" {
		if len(t) < 16 {
			return "", errors.New("mcp serve: $WATCHER_MCP_TOKEN is shorter than 16 characters")
		}
		return t, nil
	}
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b), nil
}
