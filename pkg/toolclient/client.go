// Package toolclient is a client of watcher's tool-call gateway: the
// JSON-RPC 2.0 socket (one request per line) a sandbox's agent uses to ask
// for tools. Calls may run concurrently on one Client.
//
//	c, err := toolclient.Dial("/run/watcher/sandboxes/agents/tools.sock")
//	out, err := c.Shell(ctx, "c-1", "go test ./...", 0)
//	var te *toolclient.Error
//	if errors.As(err, &te) && te.Type() == "denied" { ... }
package toolclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// Error is a JSON-RPC error from the gateway. Type names it for programs
// (denied, approval_denied, approval_timeout, outside_workspace,
// symlink_refused, rate_limited, too_large, tool_failed, ...); Message
// explains it.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    struct {
		Type    string `json:"type"`
		Tool    string `json:"tool,omitempty"`
		CallID  string `json:"call_id,omitempty"`
		Rule    string `json:"rule,omitempty"`
		Errno   string `json:"errno,omitempty"`
		Pattern string `json:"pattern,omitempty"`
		Limit   int64  `json:"limit,omitempty"`
	} `json:"data"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("gateway: %s (%s)", e.Message, e.Data.Type)
}

// Type is the error's type.
func (e *Error) Type() string { return e.Data.Type }

// TypeOf returns the gateway's error type of err ("" for nil, "other"
// for errors that did not come from the gateway), so a loop can switch on
// it.
func TypeOf(err error) string {
	var te *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &te):
		return te.Type()
	}
	return "other"
}

// ErrClosed is returned for calls on a connection the gateway closed.
var ErrClosed = errors.New("gateway connection closed")

// Client is one connection to a gateway.
type Client struct {
	// Session groups this client's calls (for session.resume); "default"
	// when empty.
	Session string

	conn    net.Conn
	wmu     sync.Mutex
	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan response
	err     error
	done    chan struct{}
}

type response struct {
	Result json.RawMessage `json:"result"`
	Error  *Error          `json:"error"`
	ID     json.RawMessage `json:"id"`
}

// Dial connects to the gateway socket at path.
func Dial(path string) (*Client, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial gateway: %w", err)
	}
	c := &Client{conn: conn, pending: map[uint64]chan response{}, done: make(chan struct{})}
	go c.read()
	return c, nil
}

// Close closes the connection; calls in flight fail with ErrClosed.
func (c *Client) Close() error { return c.conn.Close() }

func (c *Client) read() {
	defer close(c.done)
	r := bufio.NewReaderSize(c.conn, 1<<20)
	var err error
	for {
		var line []byte
		line, err = r.ReadBytes('\n')
		if err != nil {
			break
		}
		var resp response
		if json.Unmarshal(line, &resp) != nil {
			continue
		}
		id, perr := strconv.ParseUint(string(resp.ID), 10, 64)
		c.mu.Lock()
		ch := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if perr != nil || ch == nil {
			// An error without id: the gateway refused the stream and
			// closes the connection; it ends every call in flight.
			if resp.Error != nil {
				c.mu.Lock()
				c.err = resp.Error
				c.mu.Unlock()
			}
			continue
		}
		ch <- resp
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = ErrClosed
	}
	for id, ch := range c.pending {
		ch <- response{Error: nil, ID: nil}
		delete(c.pending, id)
	}
}

// Raw sends one request and decodes its result into out.
func (c *Client) Raw(ctx context.Context, method string, params, out any) error {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.next++
	id := c.next
	ch := make(chan response, 1)
	c.pending[id] = ch
	c.mu.Unlock()
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if err != nil {
		return err
	}
	c.wmu.Lock()
	_, err = c.conn.Write(append(b, '\n'))
	c.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	select {
	case resp := <-ch:
		if resp.ID == nil && resp.Error == nil {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.err
		}
		if resp.Error != nil {
			return resp.Error
		}
		if out != nil {
			return json.Unmarshal(resp.Result, out)
		}
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return ctx.Err()
	}
}

// Result is what a tool call returns: its number in the session and the
// tool's output.
type Result struct {
	CallID  string          `json:"call_id"`
	Session string          `json:"session"`
	Seq     uint64          `json:"seq"`
	Tool    string          `json:"tool"`
	Output  json.RawMessage `json:"output"`
}

// Call asks for one tool call and decodes the tool's output into out (if
// not nil).
func (c *Client) Call(ctx context.Context, callID, tool string, args, out any) (*Result, error) {
	var res Result
	err := c.Raw(ctx, "tool.request", map[string]any{"call_id": callID, "tool": tool, "arguments": args, "session": c.Session}, &res)
	if err != nil {
		return nil, err
	}
	if out != nil {
		if err := json.Unmarshal(res.Output, out); err != nil {
			return &res, fmt.Errorf("decode %s output: %w", tool, err)
		}
	}
	return &res, nil
}

// Tool is one entry of List.
type Tool struct {
	Tool   string `json:"tool"`
	Action string `json:"action"`
	Rule   string `json:"rule"`
}

// Tools is what List returns.
type Tools struct {
	Sandbox   string   `json:"sandbox"`
	Tools     []Tool   `json:"tools"`
	Workspace []string `json:"workspace"`
	Exchange  bool     `json:"exchange"`
}

// List returns the tools this sandbox may call.
func (c *Client) List(ctx context.Context) (*Tools, error) {
	var out Tools
	return &out, c.Raw(ctx, "tool.list", map[string]any{}, &out)
}

// File is read_file's output.
type File struct {
	Path      string `json:"path"`
	Content   string `json:"content"`
	Encoding  string `json:"encoding"`
	Size      int64  `json:"size"`
	Truncated bool   `json:"truncated"`
	SHA256    string `json:"sha256"`
}

// ReadFile reads a file of the workspace.
func (c *Client) ReadFile(ctx context.Context, callID, path string) (*File, error) {
	var f File
	_, err := c.Call(ctx, callID, "read_file", map[string]any{"path": path}, &f)
	return &f, err
}

// WriteFile replaces a file of the workspace with content.
func (c *Client) WriteFile(ctx context.Context, callID, path, content string) error {
	_, err := c.Call(ctx, callID, "write_file", map[string]any{"path": path, "content": content}, nil)
	return err
}

// Entry is one list_dir entry.
type Entry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Size int64  `json:"size"`
}

// ListDir lists a directory of the workspace.
func (c *Client) ListDir(ctx context.Context, callID, path string) ([]Entry, error) {
	var l struct {
		Entries []Entry `json:"entries"`
	}
	_, err := c.Call(ctx, callID, "list_dir", map[string]any{"path": path}, &l)
	return l.Entries, err
}

// ShellOutput is shell's output.
type ShellOutput struct {
	Outcome        string `json:"outcome"`
	ExitCode       int    `json:"exit_code"`
	Signal         string `json:"signal"`
	Stdout         string `json:"stdout"`
	Stderr         string `json:"stderr"`
	RefusalSummary string `json:"refusal_summary"`
	// Refusals are what the kernel's layers refused during the run.
	Refusals []Refusal `json:"refusals"`
}

// Refusal is one refused operation of a shell call, with the policy lines
// that would allow it.
type Refusal struct {
	Operation string   `json:"operation"`
	Path      string   `json:"path"`
	Address   string   `json:"address"`
	Rule      string   `json:"rule"`
	Layer     string   `json:"layer"`
	Result    string   `json:"result"`
	Errno     string   `json:"errno"`
	Process   string   `json:"process"`
	Count     int      `json:"count"`
	Allow     []string `json:"allow"`
	Note      string   `json:"note"`
}

// Shell runs a command in the sandbox (timeout 0: the policy's).
func (c *Client) Shell(ctx context.Context, callID, command string, timeoutSeconds float64) (*ShellOutput, error) {
	var out ShellOutput
	args := map[string]any{"command": command}
	if timeoutSeconds > 0 {
		args["timeout_seconds"] = timeoutSeconds
	}
	_, err := c.Call(ctx, callID, "shell", args, &out)
	return &out, err
}

// Action is one call of a session, as Resume returns it.
type Action struct {
	Seq       uint64          `json:"seq"`
	CallID    string          `json:"call_id"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	Decision  string          `json:"decision"`
	Rule      string          `json:"rule"`
	Status    string          `json:"status"`
	Output    json.RawMessage `json:"output"`
	Error     *Error          `json:"error"`
}

// Resume returns the session's calls numbered after afterSeq, and the last
// number given out.
func (c *Client) Resume(ctx context.Context, afterSeq uint64) ([]Action, uint64, error) {
	var out struct {
		LastSeq uint64   `json:"last_seq"`
		Actions []Action `json:"actions"`
	}
	err := c.Raw(ctx, "session.resume", map[string]any{"session": c.Session, "after_seq": afterSeq}, &out)
	return out.Actions, out.LastSeq, err
}

// Message is an exchange message.
type Message struct {
	Name      string `json:"name"`
	Bytes     int    `json:"bytes"`
	SHA256    string `json:"sha256"`
	Content   string `json:"content"`
	Untrusted bool   `json:"untrusted"`
}

// Put writes a message to the exchange (checked by the gateway).
func (c *Client) Put(ctx context.Context, name, content string) (*Message, error) {
	return c.exchange(ctx, "exchange.put", map[string]any{"name": name, "content": content, "session": c.Session})
}

// Get reads a message of the exchange: untrusted input.
func (c *Client) Get(ctx context.Context, name string) (*Message, error) {
	return c.exchange(ctx, "exchange.get", map[string]any{"name": name, "session": c.Session})
}

func (c *Client) exchange(ctx context.Context, method string, params any) (*Message, error) {
	var res Result
	var m Message
	if err := c.Raw(ctx, method, params, &res); err != nil {
		return &m, err
	}
	return &m, json.Unmarshal(res.Output, &m)
}
