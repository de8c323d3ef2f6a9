// Package mcpwrap relays the Model Context Protocol (JSON-RPC 2.0, one
// message a line on stdio) between an MCP client and a server that runs
// caged by `watcher mcp wrap`, and applies the sandbox's tool policy on
// the way: tools/list filtered, tools/call allowed, refused or held for
// approval, arguments checked, results capped, tool definitions pinned.
package mcpwrap

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"regexp"
)

// JSON-RPC error codes the relay answers with.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
)

// message is one JSON-RPC message; the relay forwards the original bytes
// unless it changes the message.
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   json.RawMessage `json:"error,omitempty"`
}

func (m *message) isRequest() bool  { return m.Method != "" && len(m.ID) > 0 && string(m.ID) != "null" }
func (m *message) isResponse() bool { return m.Method == "" && len(m.ID) > 0 }

// frame is one line read with a cap: Data is the whole line when it fits,
// else Over is its length and Head and Tail its ends (where a JSON-RPC id
// sits: first in some SDKs' encoding, last in others').
type frame struct {
	Data       []byte
	Over       int
	Head, Tail []byte
}

const keepEnds = 4 << 10

var errEmpty = errors.New("empty line")

// readFrame reads one line of at most max bytes (without the newline).
func readFrame(r *bufio.Reader, max int) (frame, error) {
	var buf []byte
	total := 0
	var f frame
read:
	for {
		chunk, err := r.ReadSlice('\n')
		total += len(chunk)
		if f.Over == 0 {
			if len(buf)+len(chunk) > max+1 {
				all := append(buf, chunk...)
				f.Head = append([]byte(nil), all[:min(len(all), keepEnds)]...)
				f.Over = 1
				buf = nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		if f.Over > 0 {
			if n := keepEnds - len(f.Head); n > 0 && f.Over > 1 {
				f.Head = append(f.Head, chunk[:min(n, len(chunk))]...)
			}
			f.Over = 2 // the chunk that went over is in Head already
			f.Tail = append(f.Tail, chunk...)
			if len(f.Tail) > keepEnds {
				f.Tail = append([]byte(nil), f.Tail[len(f.Tail)-keepEnds:]...)
			}
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err != nil && (total == 0 || err != io.EOF):
			return f, err
		}
		break read
	}
	if f.Over > 0 {
		f.Over = total
		f.Tail = bytes.TrimRight(f.Tail, "\r\n")
		return f, nil
	}
	f.Data = bytes.TrimRight(buf, "\r\n")
	if len(bytes.TrimSpace(f.Data)) == 0 {
		return f, errEmpty
	}
	return f, nil
}

var idNear = regexp.MustCompile(`"id"\s*:\s*(-?[0-9]+|"(?:[^"\\]|\\.){0,200}")`)

// guessID finds the JSON-RPC id of a message too long to decode: the last
// "id" member in its tail (encoders that put it last), else the first in
// its head (those that put it first).
func guessID(f frame) json.RawMessage {
	if m := idNear.FindAllSubmatch(f.Tail, -1); len(m) > 0 {
		return json.RawMessage(m[len(m)-1][1])
	}
	if m := idNear.FindSubmatch(f.Head); m != nil {
		return json.RawMessage(m[1])
	}
	return nil
}

// rpcError is a JSON-RPC error response.
func rpcError(id json.RawMessage, code int, msg string) []byte {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   any             `json:"error"`
	}{"2.0", id, map[string]any{"code": code, "message": msg}})
	return b
}

// toolResult is a tools/call response carrying text, as an error result
// (isError) when refused: the model reads it, the protocol goes on.
func toolResult(id json.RawMessage, text string, isError bool) []byte {
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  any             `json:"result"`
	}{"2.0", id, map[string]any{"content": []map[string]string{{"type": "text", "text": text}}, "isError": isError}})
	return b
}
