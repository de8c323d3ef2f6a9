package mcpwrap

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// HTTPServer speaks to a Streamable HTTP MCP server: each message the
// relay writes is POSTed; the answer (JSON, or an event stream) comes out
// of Output one message a line. The session id and protocol version the
// server set go with every later request; Close ends the session.
// Messages the server would push on a GET stream outside any request are
// not read.
type HTTPServer struct {
	url    string
	hc     *http.Client
	header http.Header
	max    int
	ctx    context.Context

	mu       sync.Mutex
	session  string
	version  string
	inited   bool
	wg       sync.WaitGroup
	outMu    sync.Mutex
	outW     *io.PipeWriter
	outR     *io.PipeReader
	closeOne sync.Once
}

// NewHTTPServer relays to url; header is sent with every request (e.g.
// Authorization). maxFrame caps one answer.
func NewHTTPServer(ctx context.Context, url string, header http.Header, maxFrame int) *HTTPServer {
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrameBytes
	}
	r, w := io.Pipe()
	return &HTTPServer{url: url, hc: &http.Client{}, header: header, max: maxFrame, ctx: ctx, outR: r, outW: w}
}

// Output is what the server says, one message a line.
func (h *HTTPServer) Output() io.Reader { return h.outR }

// Write POSTs one message (the relay writes one a call). The first,
// initialize, is answered before the next goes, for its session id.
func (h *HTTPServer) Write(b []byte) (int, error) {
	msg := append([]byte(nil), bytes.TrimSpace(b)...)
	h.mu.Lock()
	first := !h.inited
	h.inited = true
	h.mu.Unlock()
	if first {
		h.post(msg)
		return len(b), nil
	}
	h.wg.Add(1)
	go func() { defer h.wg.Done(); h.post(msg) }()
	return len(b), nil
}

// Close waits for the answers in flight, ends the session and Output.
func (h *HTTPServer) Close() error {
	h.closeOne.Do(func() {
		h.wg.Wait()
		h.mu.Lock()
		sid := h.session
		h.mu.Unlock()
		if sid != "" {
			if req, err := http.NewRequestWithContext(h.ctx, http.MethodDelete, h.url, nil); err == nil {
				h.headers(req)
				if resp, err := h.hc.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		}
		h.outW.Close()
	})
	return nil
}

func (h *HTTPServer) headers(req *http.Request) {
	for k, vs := range h.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.session != "" {
		req.Header.Set("Mcp-Session-Id", h.session)
	}
	if h.version != "" {
		req.Header.Set("MCP-Protocol-Version", h.version)
	}
}

func (h *HTTPServer) emit(b []byte) {
	var c bytes.Buffer
	if json.Compact(&c, b) != nil {
		c.Reset()
		c.Write(bytes.ReplaceAll(b, []byte("\n"), []byte(" ")))
	}
	h.outMu.Lock()
	defer h.outMu.Unlock()
	h.outW.Write(append(c.Bytes(), '\n'))
}

func (h *HTTPServer) post(msg []byte) {
	var m message
	json.Unmarshal(msg, &m)
	fail := func(why string) {
		if m.isRequest() {
			h.emit(rpcError(m.ID, -32603, "watcher: the MCP server at "+h.url+": "+why))
		}
	}
	req, err := http.NewRequestWithContext(h.ctx, http.MethodPost, h.url, bytes.NewReader(msg))
	if err != nil {
		fail(err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	h.headers(req)
	resp, err := h.hc.Do(req)
	if err != nil {
		fail(err.Error())
		return
	}
	defer resp.Body.Close()
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
		h.mu.Lock()
		h.session = sid
		h.mu.Unlock()
	}
	if resp.StatusCode == http.StatusAccepted || resp.StatusCode == http.StatusNoContent {
		return
	}
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		fail(fmt.Sprintf("HTTP %s: %s", resp.Status, strings.TrimSpace(string(b))))
		return
	}
	ct := resp.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "text/event-stream") {
		h.readEvents(resp.Body, &m)
		return
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(h.max)+1))
	if err != nil {
		fail(err.Error())
		return
	}
	if len(b) > h.max {
		fail(fmt.Sprintf("answer over the cap of %d bytes (tools.mcp.max_frame_bytes)", h.max))
		return
	}
	h.learn(&m, b)
	h.emit(b)
}

// readEvents passes on each message of an SSE stream.
func (h *HTTPServer) readEvents(body io.Reader, req *message) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), h.max+64)
	var data []byte
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0:
			if len(data) > 0 {
				h.learn(req, data)
				h.emit(data)
				data = nil
			}
		case bytes.HasPrefix(line, []byte("data:")):
			d := bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" "))
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, d...)
		}
	}
	if len(data) > 0 {
		h.emit(data)
	}
}

// learn keeps the protocol version the server chose in initialize.
func (h *HTTPServer) learn(req *message, b []byte) {
	if req.Method != "initialize" {
		return
	}
	var r struct {
		Result struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	if json.Unmarshal(b, &r) == nil && r.Result.ProtocolVersion != "" {
		h.mu.Lock()
		h.version = r.Result.ProtocolVersion
		h.mu.Unlock()
	}
}
