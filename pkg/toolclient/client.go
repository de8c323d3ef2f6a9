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

	"github.com/watcherhq/watcher/pkg/toolproto"
)

// Error is a JSON-RPC error from the gateway. Type names it for programs
// (denied, approval_denied, approval_timeout, outside_workspace,
// symlink_refused, rate_limited, too_large, tool_failed, ...: the
// toolproto.Type constants); Message explains it.
type Error = toolproto.Error

// The gateway's results, by the names this package has always used; the
// definitions are the protocol's (package toolproto).
type (
	// Result is what a tool call returns: its number in the session and
	// the tool's output.
	Result = toolproto.CallResult
	// Tool is one entry of List.
	Tool = toolproto.ToolInfo
	// Tools is what List returns.
	Tools = toolproto.ToolList
	// File is read_file's output.
	File = toolproto.FileContent
	// Entry is one list_dir entry.
	Entry = toolproto.DirEntry
	// ShellOutput is shell's output.
	ShellOutput = toolproto.ShellResult
	// Refusal is one refused operation of a shell call, with the policy
	// lines that would allow it.
	Refusal = toolproto.Refusal
	// Action is one call of a session, as Resume returns it.
	Action = toolproto.Action
	// Message is an exchange message.
	Message = toolproto.ExchangeResult
)

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
	pending map[uint64]chan toolproto.Response
	err     error
	done    chan struct{}
}

// Dial connects to the gateway socket at path.
func Dial(path string) (*Client, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial gateway: %w", err)
	}
	c := &Client{conn: conn, pending: map[uint64]chan toolproto.Response{}, done: make(chan struct{})}
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
		var resp toolproto.Response
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
		ch <- toolproto.Response{}
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
	ch := make(chan toolproto.Response, 1)
	c.pending[id] = ch
	c.mu.Unlock()
	rawParams, err := json.Marshal(params)
	if err != nil {
		return err
	}
	b, err := json.Marshal(toolproto.Request{JSONRPC: "2.0", Method: method, Params: rawParams, ID: json.RawMessage(strconv.FormatUint(id, 10))})
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

// Call asks for one tool call and decodes the tool's output into out (if
// not nil).
func (c *Client) Call(ctx context.Context, callID, tool string, args, out any) (*Result, error) {
	var res Result
	rawArgs, err := json.Marshal(args)
	if err != nil {
		return nil, fmt.Errorf("encode %s arguments: %w", tool, err)
	}
	err = c.Raw(ctx, "tool.request", toolproto.ToolParams{CallID: callID, Tool: tool, Arguments: rawArgs, Session: c.Session}, &res)
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

// List returns the tools this sandbox may call.
func (c *Client) List(ctx context.Context) (*Tools, error) {
	var out Tools
	return &out, c.Raw(ctx, "tool.list", map[string]any{}, &out)
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

// ListDir lists a directory of the workspace.
func (c *Client) ListDir(ctx context.Context, callID, path string) ([]Entry, error) {
	var l toolproto.Listing
	_, err := c.Call(ctx, callID, "list_dir", map[string]any{"path": path}, &l)
	return l.Entries, err
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

// Resume returns the session's calls numbered after afterSeq, and the last
// number given out.
func (c *Client) Resume(ctx context.Context, afterSeq uint64) ([]Action, uint64, error) {
	var out toolproto.Resumed
	err := c.Raw(ctx, "session.resume", toolproto.ResumeParams{Session: c.Session, AfterSeq: afterSeq}, &out)
	return out.Actions, out.LastSeq, err
}

// Put writes a message to the exchange (checked by the gateway).
func (c *Client) Put(ctx context.Context, name, content string) (*Message, error) {
	return c.exchange(ctx, "exchange.put", toolproto.ExchangeParams{Name: name, Content: content, Session: c.Session})
}

// Get reads a message of the exchange: untrusted input.
func (c *Client) Get(ctx context.Context, name string) (*Message, error) {
	return c.exchange(ctx, "exchange.get", toolproto.ExchangeParams{Name: name, Session: c.Session})
}

func (c *Client) exchange(ctx context.Context, method string, params toolproto.ExchangeParams) (*Message, error) {
	var res toolproto.CallResult
	var m toolproto.ExchangeResult
	if err := c.Raw(ctx, method, params, &res); err != nil {
		return &m, err
	}
	return &m, json.Unmarshal(res.Output, &m)
}
