package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/watcherhq/watcher/internal/mcpserve"
)

// mcpText is a tool result's text content.
func mcpText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

func mcpCall(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("tools/call %s: a protocol error, not a tool result: %v", tool, err)
	}
	return res
}

func wantText(t *testing.T, what string, r *mcp.CallToolResult, isError bool, parts ...string) {
	t.Helper()
	text := mcpText(r)
	if r.IsError != isError {
		t.Errorf("%s: isError %v, want %v:\n%s", what, r.IsError, isError, text)
	}
	for _, p := range parts {
		if !strings.Contains(text, p) {
			t.Errorf("%s: result lacks %q:\n%s", what, p, text)
		}
	}
}

// TestMCPServe drives the real agent's gateway as an MCP server with the
// official Go SDK's client: over stdio (`watcher mcp serve`, spawned by
// the client), over Streamable HTTP on the sandbox's socket (with
// elicitation for ask rules) and on a loopback port with a bearer token.
// tools/list shows the policy's tools only; refusals are tool results
// whose text names the rule, the layer and the policy lines that would
// allow the call; the ledger holds the client's initialize and every
// call with its MCP session and request id, and replays a shell call from
// request to syscall.
func TestMCPServe(t *testing.T) {
	tb, sock, _ := gatewayTestbed(t)
	os.WriteFile(filepath.Join(tb.ws, "README"), []byte("benign\n"), 0o644)
	ctx := context.Background()

	// 1. stdio, no elicitation: ask rules wait for `watcher approve`.
	client := mcp.NewClient(&mcp.Implementation{Name: "watcher-e2e-stdio", Version: "1.2.3"}, nil)
	cmd := exec.Command(tb.bin, "mcp", "serve", "--socket-dir", tb.socketDir, "--sandbox", "agents")
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect over stdio: %v\nagent log:\n%s", err, tb.agentLog)
	}
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.Name == "shell" {
			b, _ := json.Marshal(tl.InputSchema)
			if !strings.Contains(string(b), `"command"`) || !strings.Contains(string(b), `"additionalProperties":false`) {
				t.Errorf("shell's schema lacks its argument constraints: %s", b)
			}
		}
	}
	slices.Sort(names)
	if strings.Join(names, ",") != "exchange_get,exchange_put,read_file,shell,write_file" {
		t.Errorf("tools/list: %v, want read_file, shell, write_file and the exchange (list_dir is denied by the policy)", names)
	}

	wantText(t, "read_file README", mcpCall(t, cs, "read_file", map[string]any{"path": "README"}), false, "benign")
	wantText(t, "list_dir (denied)", mcpCall(t, cs, "list_dir", map[string]any{"path": "."}), true,
		"REFUSED", "rule: no-listing", "layer: gateway tool rules", "{tool: list_dir, action: allow}")
	wantText(t, "http_fetch (no such tool)", mcpCall(t, cs, "http_fetch", map[string]any{"url": "http://198.18.0.1/"}), true,
		"REFUSED", "no tool \"http_fetch\"", "default-deny")
	wantText(t, "read_file /etc/shadow", mcpCall(t, cs, "read_file", map[string]any{"path": "/etc/shadow"}), true,
		"REFUSED", "outside the workspace", "layer: kernel path resolution")
	wantText(t, "read_file with an unknown member", mcpCall(t, cs, "read_file", map[string]any{"path": "README", "mode": "x"}), true,
		"REFUSED", "unknown field")
	shell := mcpCall(t, cs, "shell", map[string]any{"command": "echo hi; cat /etc/shadow"})
	wantText(t, "shell cat /etc/shadow", shell, true, "hi", "refused read /etc/shadow", "policy lines that would allow")
	shellID, _ := shell.Meta[mcpserve.MetaCallID].(string)
	if shellID == "" {
		t.Fatalf("the shell result's _meta lacks %s: %v", mcpserve.MetaCallID, shell.Meta)
	}

	// write_file asks: approved from the CLI while the client waits.
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		done <- mcpCall(t, cs, "write_file", map[string]any{"path": "notes.txt", "content": "from mcp"})
	}()
	gwSock := filepath.Join(tb.socketDir, "gateway.sock")
	var id string
	for start := time.Now(); id == "" && time.Since(start) < 3*time.Second; time.Sleep(20 * time.Millisecond) {
		out, _ := tb.watcher("approvals", "--json", "--socket", gwSock)
		for _, l := range strings.Split(out, "\n") {
			var p struct{ ID, Tool string }
			if json.Unmarshal([]byte(l), &p) == nil && p.Tool == "write_file" {
				id = p.ID
			}
		}
	}
	if id == "" {
		t.Fatal("write_file over MCP never waited for approval")
	}
	if out, code := tb.watcher("approve", "--socket", gwSock, id); code != 0 {
		t.Fatalf("approve: %s", out)
	}
	wantText(t, "write_file approved", <-done, false, `"bytes": 8`)
	if b, _ := os.ReadFile(filepath.Join(tb.ws, "notes.txt")); string(b) != "from mcp" {
		t.Errorf("notes.txt: %q", b)
	}
	cs.Close()

	// 1b. stdio with elicitation: the relay carries the server's request
	// and the client's answer while the call waits.
	sclient := mcp.NewClient(&mcp.Implementation{Name: "watcher-e2e-stdio-elicit", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept"}, nil
		}})
	ss, err := sclient.Connect(ctx, &mcp.CommandTransport{Command: exec.Command(tb.bin, "mcp", "serve", "--socket-dir", tb.socketDir, "--sandbox", "agents")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "write_file elicited over stdio", mcpCall(t, ss, "write_file", map[string]any{"path": "s.txt", "content": "stdio"}), false, `"bytes": 5`)
	ss.Close()

	// 2. Streamable HTTP on the sandbox's own socket, with elicitation:
	// the client's user answers the ask.
	var asked string
	eclient := mcp.NewClient(&mcp.Implementation{Name: "watcher-e2e-http", Version: "0.1"}, &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked = req.Params.Message
			if strings.Contains(req.Params.Message, "decline-me") {
				return &mcp.ElicitResult{Action: "decline"}, nil
			}
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"reason": "looks fine"}}, nil
		}})
	hs, err := eclient.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: mcpserve.SocketURL, HTTPClient: mcpserve.SocketClient(sock)}, nil)
	if err != nil {
		t.Fatalf("connect over the socket: %v", err)
	}
	wantText(t, "write_file elicited", mcpCall(t, hs, "write_file", map[string]any{"path": "e.txt", "content": "yes"}), false, `"bytes": 3`)
	if !strings.Contains(asked, "write_file") || !strings.Contains(asked, "e.txt") {
		t.Errorf("the elicitation did not show the call: %q", asked)
	}
	wantText(t, "write_file declined", mcpCall(t, hs, "write_file", map[string]any{"path": "decline-me", "content": "no"}), true,
		"REFUSED", "declined", "layer: approval")
	hs.Close()

	// 3. A loopback port with a bearer token.
	port := freePort(t)
	token := "0123456789abcdef0123"
	srv := exec.Command(tb.bin, "mcp", "serve", "--socket", sock, "--http", "127.0.0.1:"+strconv.Itoa(port))
	srv.Env = append(os.Environ(), "WATCHER_MCP_TOKEN="+token)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() }()
	endpoint := "http://127.0.0.1:" + strconv.Itoa(port) + mcpserve.Path
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(endpoint); err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("GET without a token: HTTP %d, want 401", resp.StatusCode)
			}
			break
		}
	}
	authed := &http.Client{Transport: bearer{token: token}}
	ls, err := mcp.NewClient(&mcp.Implementation{Name: "watcher-e2e-loopback", Version: "0.1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: authed, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatalf("connect over loopback: %v", err)
	}
	wantText(t, "read_file over loopback", mcpCall(t, ls, "read_file", map[string]any{"path": "e.txt"}), false, "yes")
	ls.Close()
	if _, err := mcp.NewClient(&mcp.Implementation{Name: "no-token"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, DisableStandaloneSSE: true, MaxRetries: -1}, nil); err == nil {
		t.Error("a client without the token connected")
	}

	// The ledger: initialize with the client's name, the calls with their
	// MCP session and request id, the approvals; one call replayed.
	tb.stopAgent(syscall.SIGTERM)
	out, code := tb.watcher("ledger", "cat", "--json", "--kind", "tool", tb.ledger)
	if code != 0 {
		t.Fatalf("ledger cat: %s", out)
	}
	var inits, withRequest int
	elicited := false
	for _, l := range strings.Split(out, "\n") {
		var ev ledgerEvent
		if json.Unmarshal([]byte(l), &ev) != nil || ev.Tool == nil {
			continue
		}
		var raw struct {
			Tool struct {
				Protocol        string `json:"protocol"`
				ProtocolSession string `json:"protocol_session"`
				ProtocolRequest string `json:"protocol_request"`
			} `json:"tool"`
		}
		json.Unmarshal([]byte(l), &raw)
		if ev.Tool.Stage == "initialize" && strings.Contains(l, "watcher-e2e-stdio") && strings.Contains(l, "1.2.3") && raw.Tool.ProtocolSession != "" {
			inits++
		}
		if ev.Tool.Stage == "request" && raw.Tool.Protocol == "mcp" && raw.Tool.ProtocolSession != "" && raw.Tool.ProtocolRequest != "" {
			withRequest++
		}
		if ev.Tool.Stage == "approval" && strings.Contains(ev.Tool.By, "elicitation") {
			elicited = true
		}
	}
	if inits == 0 || withRequest < 8 || !elicited {
		t.Errorf("ledger: %d initialize records of the stdio client, %d MCP requests with session and request id (want >= 8), elicited approval %v:\n%s",
			inits, withRequest, elicited, out)
	}
	checkReplay(t, tb, shellID)
}

// bearer adds the token to each request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpCache is where scripts/setup.sh installs the official Python and
// TypeScript MCP SDKs and the conformance suite.
func mcpCache() string {
	if d := os.Getenv("WATCHER_MCP_CACHE"); d != "" {
		return d
	}
	return "/var/cache/watcher-test/mcp"
}

// TestMCPClientsSDKs: MCP clients on the official TypeScript and Python
// SDKs spawn `watcher mcp serve`, list the sandbox's tools and get
// readable refusals.
func TestMCPClientsSDKs(t *testing.T) {
	tb, _, _ := gatewayTestbed(t)
	os.WriteFile(filepath.Join(tb.ws, "README"), []byte("benign\n"), 0o644)
	want := []string{
		"tools: exchange_get,exchange_put,read_file,shell,write_file",
		`read_file: isError=false "benign\n"`,
		`read_file: isError=true "REFUSED: /etc/shadow: refused by the kernel: the path resolves outside the workspace (EXDEV)`,
		`list_dir: isError=true "REFUSED: the policy denies tool \"list_dir\" (rule no-listing)`,
		`shell: isError=true "outcome exited, exit code 1`, "refused read /etc/shadow (rule cred-shadow, by landlock)",
	}
	t.Run("go-example", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "mcp-agent")
		if out, err := exec.Command("go", "build", "-o", bin, "../../examples/mcp-agent").CombinedOutput(); err != nil {
			t.Fatalf("build examples/mcp-agent: %v\n%s", err, out)
		}
		out, err := exec.Command(bin, tb.bin, "mcp", "serve", "--socket-dir", tb.socketDir, "--sandbox", "agents").CombinedOutput()
		check(t, "examples/mcp-agent", string(out), err, []string{"tools: read_file, write_file, shell",
			"1 list_dir (isError", "2 read_file (ok", "benign", "3 write_file (isError", "no approver answered",
			"4 shell (isError", "refused read /etc/shadow", "5 read_file (isError", "6 http_fetch (isError", "default-deny"})
	})
	// The repository's own Python client speaks MCP with the standard
	// library only, so it runs where the SDK cannot be installed.
	t.Run("python-example", func(t *testing.T) {
		py, err := exec.LookPath("python3")
		if err != nil {
			t.Skip("python3 is not installed")
		}
		script, _ := filepath.Abs("../../examples/python/mcp_agent_loop.py")
		out, err := exec.Command(py, script, tb.bin, tb.socketDir, "agents").CombinedOutput()
		check(t, "examples/python/mcp_agent_loop.py", string(out), err, want)
	})
	cache := mcpCache()
	t.Run("typescript", func(t *testing.T) {
		mods := filepath.Join(cache, "node", "node_modules")
		if _, err := os.Stat(filepath.Join(mods, "@modelcontextprotocol", "sdk")); err != nil {
			t.Skipf("@modelcontextprotocol/sdk (npm) is not installed in %s (scripts/setup.sh installs it): %v", mods, err)
		}
		node, err := exec.LookPath("node")
		if err != nil {
			t.Skip("node is not installed")
		}
		script, _ := filepath.Abs("../../test/mcp/node_client.mjs")
		cmd := exec.Command(node, script, tb.bin, tb.socketDir, "agents")
		cmd.Env = append(os.Environ(), "NODE_PATH="+mods)
		out, err := cmd.CombinedOutput()
		check(t, "node_client.mjs", string(out), err, want)
	})
	t.Run("python", func(t *testing.T) {
		py := filepath.Join(cache, "py", "bin", "python")
		if err := exec.Command(py, "-c", "import mcp").Run(); err != nil {
			t.Skipf("the Python MCP SDK (mcp on PyPI) is not installed in the venv %s (scripts/setup.sh installs it where PyPI is reachable): %v", filepath.Dir(filepath.Dir(py)), err)
		}
		script, _ := filepath.Abs("../../test/mcp/python_client.py")
		out, err := exec.Command(py, script, tb.bin, tb.socketDir, "agents").CombinedOutput()
		check(t, "python_client.py", string(out), err, want)
	})
}

// TestMCPConformance runs the MCP conformance suite's server scenarios
// (@modelcontextprotocol/conformance) against a sandbox's MCP endpoint,
// reached through a loopback relay to the gateway socket, and logs each
// scenario's result. The scenarios that need tools, prompts or resources
// the reference server has and a watcher sandbox does not are expected to
// fail (docs/concepts/mcp.md lists them); the protocol's core must pass.
func TestMCPConformance(t *testing.T) {
	cli := os.Getenv("WATCHER_MCP_CONFORMANCE")
	if cli == "" {
		cli = filepath.Join(mcpCache(), "node", "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	}
	if _, err := os.Stat(cli); err != nil {
		t.Skipf("@modelcontextprotocol/conformance (npm) is not installed (scripts/setup.sh installs it): %v", err)
	}
	tb, sock, _ := gatewayTestbed(t)
	// The real loopback endpoint (`watcher mcp serve --http`); the suite
	// sends no bearer token, so a relay in front of it adds it (and passes
	// Host and Origin on, which the endpoint checks).
	port := freePort(t)
	token := "conformance-token-0123456789"
	serve := exec.Command(tb.bin, "mcp", "serve", "--socket", sock, "--http", "127.0.0.1:"+strconv.Itoa(port))
	serve.Env = append(os.Environ(), "WATCHER_MCP_TOKEN="+token)
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { serve.Process.Signal(syscall.SIGTERM); serve.Wait() }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(port))
	proxy := httputil.NewSingleHostReverseProxy(target)
	director := proxy.Director
	proxy.Director = func(r *http.Request) { director(r); r.Header.Set("Authorization", "Bearer "+token) }
	proxy.FlushInterval = -1
	srv := &http.Server{Handler: proxy}
	go srv.Serve(ln)
	defer srv.Close()
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", target.Host); err == nil {
			c.Close()
			break
		}
	}
	outDir := t.TempDir()
	cmd := exec.Command("node", cli, "server", "--url", "http://"+ln.Addr().String()+mcpserve.Path, "-o", outDir)
	out, err := cmd.CombinedOutput()
	t.Logf("conformance (%v):\n%s", err, out)
	passed := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l)
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "✓" {
			passed[strings.TrimSuffix(f[1], ":")] = true
		}
	}
	for _, sc := range []string{"server-initialize", "ping", "tools-list", "tools-call-error", "server-sse-multiple-streams", "dns-rebinding-protection"} {
		if !passed[sc] {
			t.Errorf("conformance scenario %s did not pass", sc)
		}
	}
}
