package mcpserve

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"
)

// This file is the client side of `watcher mcp serve`: the agent serves
// MCP on the sandbox's socket; the command relays a stdio client's
// messages to it, or serves a loopback port that forwards to it. The
// relay carries messages, it decides nothing.

// SocketClient is an HTTP client whose every connection goes to the Unix
// socket at path; use it with the URL "http://watcher" + Path.
func SocketClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConns: 4, IdleConnTimeout: 30 * time.Second,
	}}
}

// SocketURL is the MCP endpoint's URL for a SocketClient.
const SocketURL = "http://watcher" + Path

// maxLine caps one stdio message (as the Go SDK's stdio transport does).
const maxLine = 16 << 20

// Relay copies MCP messages between a stdio client (newline-delimited
// JSON-RPC on in and out) and the Streamable HTTP endpoint at endpoint,
// until in ends (then it ends the HTTP session) or ctx does.
func Relay(ctx context.Context, in io.Reader, out io.Writer, client *http.Client, endpoint string) error {
	r := &relay{client: client, url: endpoint, out: out}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	var streams sync.WaitGroup
	defer streams.Wait()
	lines := make(chan []byte)
	scanErr := make(chan error, 1)
	go func() {
		defer close(lines)
		for sc.Scan() {
			select {
			case lines <- append([]byte(nil), sc.Bytes()...):
			case <-ctx.Done():
				return
			}
		}
		scanErr <- sc.Err()
	}()
	for {
		select {
		case <-ctx.Done():
			r.end()
			return ctx.Err()
		case line, ok := <-lines:
			if !ok {
				r.end()
				select {
				case err := <-scanErr:
					return err
				default:
					return nil
				}
			}
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			var env envelope
			json.Unmarshal(line, &env)
			if env.Method == "initialize" || len(env.ID) == 0 || env.Method == "" {
				// initialize's answer carries the session the rest need;
				// notifications and answers to the server's requests
				// (elicitation) are acknowledged at once: in order.
				r.send(ctx, line, env, &streams)
				continue
			}
			// A request may wait long for its answer (a call held for
			// approval): the next messages must not wait behind it.
			streams.Add(1)
			go func() { defer streams.Done(); r.send(ctx, line, env, &streams) }()
		}
	}
}

type relay struct {
	client  *http.Client
	url     string
	wmu     sync.Mutex
	out     io.Writer
	mu      sync.Mutex
	session string
	version string
	// stopListen ends the standalone event stream.
	stopListen context.CancelFunc
}

type envelope struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Result json.RawMessage `json:"result"`
}

// send POSTs one message; its answer (JSON or an event stream) is copied
// to the client as it comes, in the background except for initialize,
// whose answer carries the session and protocol version later requests
// need.
func (r *relay) send(ctx context.Context, msg []byte, env envelope, streams *sync.WaitGroup) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(msg))
	if err != nil {
		r.fail(env.ID, err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	r.mu.Lock()
	if r.session != "" {
		req.Header.Set("Mcp-Session-Id", r.session)
	}
	if r.version != "" {
		req.Header.Set("Mcp-Protocol-Version", r.version)
	}
	r.mu.Unlock()
	resp, err := r.client.Do(req)
	if err != nil {
		r.fail(env.ID, "the watcher agent's MCP endpoint: "+err.Error())
		return
	}
	if s := resp.Header.Get("Mcp-Session-Id"); s != "" {
		r.mu.Lock()
		r.session = s
		r.mu.Unlock()
	}
	copyBody := func() {
		defer resp.Body.Close()
		r.copy(env, resp)
	}
	if env.Method == "initialize" {
		copyBody()
		// The server's own messages (tools/list_changed after a policy
		// reload) come on a stream of their own.
		streams.Add(1)
		go func() { defer streams.Done(); r.listen(ctx) }()
		return
	}
	streams.Add(1)
	go func() { defer streams.Done(); copyBody() }()
}

func (r *relay) copy(env envelope, resp *http.Response) {
	ct := resp.Header.Get("Content-Type")
	switch {
	case resp.StatusCode == http.StatusAccepted:
		io.Copy(io.Discard, resp.Body)
	case resp.StatusCode >= 300:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Valid(bytes.TrimSpace(b)) && bytes.Contains(b, []byte(`"jsonrpc"`)) {
			r.write(bytes.TrimSpace(b), env)
			return
		}
		r.fail(env.ID, fmt.Sprintf("HTTP %d from the watcher agent: %s", resp.StatusCode, strings.TrimSpace(string(b))))
	case strings.HasPrefix(ct, "text/event-stream"):
		r.events(resp.Body, env)
	default:
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxLine))
		if err != nil {
			r.fail(env.ID, err.Error())
			return
		}
		if b = bytes.TrimSpace(b); len(b) > 0 {
			r.write(b, env)
		}
	}
}

// events copies the data of each server-sent event.
func (r *relay) events(body io.Reader, env envelope) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	var data bytes.Buffer
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0:
			if data.Len() > 0 {
				r.write(bytes.TrimSpace(data.Bytes()), env)
				data.Reset()
			}
		case bytes.HasPrefix(line, []byte("data:")):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.Write(bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" ")))
		}
	}
	if data.Len() > 0 {
		r.write(bytes.TrimSpace(data.Bytes()), env)
	}
}

// write sends one message to the client; the answer to initialize also
// sets the protocol version of later requests.
func (r *relay) write(msg []byte, env envelope) {
	if env.Method == "initialize" {
		var got envelope
		if json.Unmarshal(msg, &got) == nil && bytes.Equal(got.ID, env.ID) {
			var res struct {
				ProtocolVersion string `json:"protocolVersion"`
			}
			if json.Unmarshal(got.Result, &res) == nil && res.ProtocolVersion != "" {
				r.mu.Lock()
				r.version = res.ProtocolVersion
				r.mu.Unlock()
			}
		}
	}
	var compact bytes.Buffer
	if json.Compact(&compact, msg) == nil {
		msg = compact.Bytes()
	}
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.out.Write(append(msg, '\n'))
}

// fail answers a request the relay could not deliver with a JSON-RPC
// error (a notification gets nothing).
func (r *relay) fail(id json.RawMessage, why string) {
	if len(id) == 0 || string(id) == "null" {
		return
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": -32603, "message": why}})
	r.write(b, envelope{})
}

// listen copies the session's standalone event stream (GET) to the client
// until the relay ends, reconnecting after a pause when it breaks; a
// server that offers none (405) is left alone.
func (r *relay) listen(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	r.mu.Lock()
	r.stopListen = cancel
	r.mu.Unlock()
	defer cancel()
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
		if err != nil {
			return
		}
		req.Header.Set("Accept", "text/event-stream")
		r.mu.Lock()
		if r.session == "" {
			r.mu.Unlock()
			return
		}
		req.Header.Set("Mcp-Session-Id", r.session)
		if r.version != "" {
			req.Header.Set("Mcp-Protocol-Version", r.version)
		}
		r.mu.Unlock()
		resp, err := r.client.Do(req)
		if err == nil {
			ok := resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
			if ok {
				r.events(resp.Body, envelope{})
			}
			resp.Body.Close()
			if !ok && resp.StatusCode >= 400 && resp.StatusCode < 500 {
				return // no stream for this session (405), or the session is gone
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// end closes the HTTP session.
func (r *relay) end() {
	r.mu.Lock()
	if r.stopListen != nil {
		r.stopListen()
	}
	r.mu.Unlock()
	r.mu.Lock()
	s := r.session
	r.mu.Unlock()
	if s == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, r.url, nil)
	if err != nil {
		return
	}
	req.Header.Set("Mcp-Session-Id", s)
	if resp, err := r.client.Do(req); err == nil {
		resp.Body.Close()
	}
}

// loopbackHost says whether a Host header names loopback (127.0.0.0/8,
// ::1 or localhost), with or without a port.
func loopbackHost(h string) bool {
	host := h
	if hh, _, err := net.SplitHostPort(h); err == nil {
		host = hh
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func loopbackOrigin(o string) bool {
	u, err := url.Parse(o)
	return err == nil && u.Host != "" && loopbackHost(u.Host)
}

// Loopback serves the MCP endpoint on a loopback address, forwarding to
// the sandbox's socket through client; each request must carry
// "Authorization: Bearer TOKEN". It returns when ctx ends.
func Loopback(ctx context.Context, ln net.Listener, token string, client *http.Client) error {
	if token == "" {
		return errors.New("loopback MCP needs a bearer token")
	}
	if a, ok := ln.Addr().(*net.TCPAddr); !ok || !a.IP.IsLoopback() {
		return fmt.Errorf("loopback MCP: %s is not a loopback address", ln.Addr())
	}
	target, _ := url.Parse("http://watcher")
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = client.Transport
	proxy.FlushInterval = -1 // event streams as they come
	want := []byte("Bearer " + token)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// A web page must not reach the port by a DNS name that resolves
		// to loopback (DNS rebinding): the Host, and an Origin if sent,
		// must name loopback.
		if !loopbackHost(req.Host) || (req.Header.Get("Origin") != "" && !loopbackOrigin(req.Header.Get("Origin"))) {
			http.Error(w, "Host and Origin must name a loopback address", http.StatusForbidden)
			return
		}
		if subtle.ConstantTimeCompare([]byte(req.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="watcher"`)
			http.Error(w, "a bearer token is required (the one `watcher mcp serve --http` printed or read)", http.StatusUnauthorized)
			return
		}
		if req.URL.Path != Path {
			http.Error(w, "the MCP endpoint is "+Path, http.StatusNotFound)
			return
		}
		req.Header.Del("Authorization") // not for the agent
		proxy.ServeHTTP(w, req)
	})}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
