package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/mcpwrap"
	"github.com/watcherhq/watcher/internal/policy"
)

// runMCPWrap is `watcher mcp wrap`: an MCP server caged in a fresh sandbox
// (the path of `watcher exec`), or reached at a URL, with the relay
// between it and the client on our stdin and stdout. It returns the exit
// code.
func runMCPWrap(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := mcpWrap(ctx, args, os.Stdin, os.Stdout, os.Stderr)
	if err == nil || errors.Is(err, errHelpShown) {
		return 0
	}
	code := 1
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.Code
	}
	fmt.Fprintln(os.Stderr, errorText(err))
	return code
}

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

func mcpWrap(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mcp wrap", flag.ContinueOnError)
	sandboxName := fs.String("sandbox", "", "sandbox of the policy to run the server in (default: the first)")
	preset := fs.String("preset", "", "run the server under this preset (read-only, restricted, dev, ops)")
	policyPath := fs.String("policy", "", "policy file (implies a private agent)")
	workspace := fs.String("workspace", "", "the server's workspace, read-write (default with --preset or the built-in policy: the current directory)")
	serverURL := fs.String("url", "", "relay to the Streamable HTTP MCP server at this URL instead of starting one (only the relay's policy applies)")
	var headers headerFlags
	fs.Var(&headers, "header", "with --url, an HTTP header 'Name: value' for every request (repeatable)")
	asUser := fs.String("as-user", "", "run the server as UID:GID (as watcher exec --as-user)")
	accept := fs.Bool("accept-changes", false, "approve the server's current tool definitions where they differ from the pinned ones")
	socket := fs.String("socket", control.DefaultSocket, "control socket of a running agent")
	if err := parseFlags(fs, args, stderr, `Usage: watcher mcp wrap [--sandbox S | --preset P] [--workspace DIR] -- CMD [ARGS...]
       watcher mcp wrap --url URL [--policy FILE | --preset P]

Starts the stdio MCP server CMD in a fresh sandbox (the cage of watcher
exec: leaf cgroup, seccomp, Landlock, namespaces, the DNS allowlist, its
workspace) and relays JSON-RPC between the client on stdin/stdout and the
server. The sandbox's tools.mcp rules decide the server's tools: tools/list
shows only what may be called, tools/call is allowed, refused (a result
with isError whose text says what, by which rule, and what would allow it)
or held for 'watcher approve'; arguments are checked, results capped. Tool
definitions are pinned on first sight (in the agent's state directory): a
tool whose name, description or input schema changes later is hidden and
refused until approved again with --accept-changes, and the change is
recorded. The server's kernel events during a call carry the call's label
(SESSION.call-N); between calls, the session's. See docs/concepts/mcp-wrap.md.`); err != nil {
		return helpOK(err)
	}
	argv := fs.Args()
	if (*serverURL == "") == (len(argv) == 0) {
		return &exitError{Code: 2, Err: errors.New("mcp wrap needs a server: -- CMD [ARGS...] or --url URL (not both)")}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	b := make([]byte, 4)
	rand.Read(b)
	session := "mcp-" + hex.EncodeToString(b)
	summaryOf := func(pol *policy.Policy, sb *policy.Sandbox) func(string, []audit.Event) string {
		wd, _ := os.Getwd()
		return func(label string, evs []audit.Event) string {
			rep := &agent.RunReport{Label: label, Sandbox: sb.Name, Mode: string(sb.Mode), Refusals: agent.Refusals(pol, sb, evs, wd)}
			agent.SortRefusals(rep.Refusals)
			var buf bytes.Buffer
			rep.WriteSummary(&buf)
			return buf.String()
		}
	}

	if *serverURL != "" {
		return wrapURL(ctx, *serverURL, headers, *policyPath, *preset, *sandboxName, *workspace, *socket, *accept, session, stdin, stdout, log)
	}

	// The server's stdio: the relay writes its stdin and reads its stdout.
	toServerR, toServerW := io.Pipe()
	fromServerR, fromServerW := io.Pipe()
	var relay atomic.Pointer[mcpwrap.Relay]
	var tagger atomic.Pointer[mcpwrap.Tagger]
	relayDone := make(chan error, 1)
	hooks := &execHooks{
		Stdin: toServerR, Stdout: fromServerW,
		OnEvent: func(e audit.Event) {
			if r := relay.Load(); r != nil {
				r.AddEvent(e)
			}
		},
		OnLeaf: func(leaf string) {
			if t := tagger.Load(); t != nil {
				t.SetLeaf(leaf)
			}
		},
		Ready: func(env execEnv) {
			parent, err := cgroupfs.Abs(env.ExecParent)
			if err != nil {
				parent = env.ExecParent
			}
			t := mcpwrap.NewTagger(parent, session)
			tagger.Store(t)
			cfg := mcpwrap.Config{Sandbox: env.Sandbox.Name, Session: session, Rules: env.Sandbox.Tools.MCP, AcceptChanges: *accept,
				Suspicious: mcpwrap.DescriptionPatterns(env.Sandbox),
				Tagger:     t, Summary: summaryOf(env.Policy, env.Sandbox),
				Record: func(e audit.Event) {
					if err := env.Record(e); err != nil {
						log.Warn("not recorded", "err", err)
					}
				}}
			pins, err := mcpwrap.OpenPins(filepath.Join(agent.StateDir(env.Policy), "mcp-pins"), mcpwrap.PinKey(env.Sandbox.Name, argv), strings.Join(argv, " "))
			if err != nil {
				log.Warn("tool pinning is off", "err", err)
			}
			cfg.Pins = pins
			if env.Hold != nil {
				cfg.Hold = env.Hold
				cfg.ApproveHint = "watcher approve --socket " + env.ApprovalsSocket
				log.Info("calls the policy asks about wait for", "command", cfg.ApproveHint+" "+env.Sandbox.Name+"/"+session+".N")
			}
			r := mcpwrap.New(cfg)
			relay.Store(r)
			go func() { relayDone <- r.Run(ctx, stdin, stdout, toServerW, fromServerR) }()
		},
	}
	execArgs := []string{"-q", "--label", session, "--warn=0", "--term=0", "--kill=0", "--socket", *socket}
	for name, v := range map[string]string{"sandbox": *sandboxName, "preset": *preset, "policy": *policyPath, "workspace": *workspace, "as-user": *asUser} {
		if v != "" {
			execArgs = append(execArgs, "--"+name, v)
		}
	}
	execArgs = append(append(execArgs, "--"), argv...)
	runErr := runExecHooked(ctx, execArgs, stdout, stderr, hooks)
	fromServerW.Close()
	toServerR.Close()
	if relay.Load() != nil {
		if err := <-relayDone; err != nil {
			log.Warn("relay", "err", err)
		}
	}
	return runErr
}

// wrapURL relays to a Streamable HTTP server: the policy's tool rules and
// pins apply, the ledger is the running agent's (without one, nothing is
// recorded, and it says so).
func wrapURL(ctx context.Context, rawURL string, headers headerFlags, policyPath, preset, sandboxName, workspace, socket string, accept bool, session string, stdin io.Reader, stdout io.Writer, log *slog.Logger) error {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return &exitError{Code: 2, Err: fmt.Errorf("--url %q: want an http or https URL", rawURL)}
	}
	hdr := http.Header{}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			return &exitError{Code: 2, Err: fmt.Errorf("--header %q: want 'Name: value'", h)}
		}
		hdr.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	var record func(audit.Event)
	if st, err := control.NewClient(socket).Status(); err == nil {
		if policyPath == "" && preset == "" {
			policyPath = st.Policy
		}
		record = func(e audit.Event) {
			if err := control.NewClient(socket).Record(e); err != nil {
				log.Warn("not recorded", "err", err)
			}
		}
	} else {
		log.Warn("no agent is running: the calls are decided but not recorded in a ledger")
	}
	ws, _ := workspaceDir(workspace)
	var pol *policy.Policy
	switch {
	case preset != "":
		pol, err = presetPolicy(preset, ws)
	case policyPath != "":
		pol, err = policy.Load(policyPath)
	default:
		pol = policy.Default()
	}
	if err != nil {
		return err
	}
	sb, err := pickSandbox(pol, sandboxName)
	if err != nil {
		return err
	}
	cfg := mcpwrap.Config{Sandbox: sb.Name, Session: session, Rules: sb.Tools.MCP, AcceptChanges: accept, Record: record,
		Suspicious: mcpwrap.DescriptionPatterns(sb)}
	if cfg.Pins, err = mcpwrap.OpenPins(filepath.Join(agent.StateDir(pol), "mcp-pins"), mcpwrap.PinKey(sb.Name, []string{rawURL}), rawURL); err != nil {
		log.Warn("tool pinning is off", "err", err)
	}
	srv := mcpwrap.NewHTTPServer(ctx, rawURL, hdr, sb.Tools.MCP.MaxFrameBytes)
	return mcpwrap.New(cfg).Run(ctx, stdin, stdout, srv, srv.Output())
}
