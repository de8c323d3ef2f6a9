package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// JSON-RPC 2.0 error codes: the protocol's own, then the gateway's typed
// errors (the server range -32000..-32099). Error.Data.Type names the error
// for programs; Message explains it for the agent's model.
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
	CodeInternal       = -32603

	CodeDenied          = -32001 // the policy refuses the tool (or no rule names it)
	CodeApproval        = -32002 // an approver denied the call, or nobody answered in time
	CodePathRefused     = -32003 // the kernel's path resolution refused the path
	CodeRateLimited     = -32004 // over the sandbox's call rate or in-flight cap
	CodeTooLarge        = -32005 // arguments or frame over the limit
	CodeToolFailed      = -32006 // the tool ran and failed (I/O error, breaker open)
	CodeDuplicateCall   = -32007 // the call id was already used in the session
	CodeExchangeRefused = -32008 // exchange content refused (type, size, pattern)
)

// Error types (Error.Data.Type).
const (
	TypeParse           = "parse_error"
	TypeInvalidRequest  = "invalid_request"
	TypeFrameTooLarge   = "frame_too_large"
	TypeMethodNotFound  = "method_not_found"
	TypeInvalidParams   = "invalid_params"
	TypeInternal        = "internal"
	TypeDenied          = "denied"
	TypeApprovalDenied  = "approval_denied"
	TypeApprovalTimeout = "approval_timeout"
	TypeOutside         = "outside_workspace"
	TypeSymlink         = "symlink_refused"
	TypeHardlink        = "hardlink_refused"
	TypeNotRegular      = "not_regular_file"
	TypeNotFound        = "not_found"
	TypeRateLimited     = "rate_limited"
	TypeBusy            = "too_many_in_flight"
	TypeTooLarge        = "too_large"
	TypeToolFailed      = "tool_failed"
	TypeDuplicateCall   = "duplicate_call"
	TypeExchangeRefused = "exchange_refused"
)

// Request is one JSON-RPC 2.0 request frame.
type Request struct {
	JSONRPC string          `json:"jsonrpc"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
	ID      json.RawMessage `json:"id,omitempty"`
}

// Response is one JSON-RPC 2.0 response frame.
type Response struct {
	JSONRPC string          `json:"jsonrpc"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
	ID      json.RawMessage `json:"id"`
}

// Error is a JSON-RPC error with the gateway's typed data.
type Error struct {
	Code    int        `json:"code"`
	Message string     `json:"message"`
	Data    *ErrorData `json:"data,omitempty"`
}

// ErrorData says what kind of refusal or failure it was.
type ErrorData struct {
	// Type names the error (TypeDenied, TypeOutside, ...).
	Type string `json:"type"`
	// Tool and CallID identify the call, when there was one.
	Tool   string `json:"tool,omitempty"`
	CallID string `json:"call_id,omitempty"`
	// Rule is the policy rule that decided.
	Rule string `json:"rule,omitempty"`
	// Errno is the kernel's error for refused paths (EXDEV, ELOOP, ...).
	Errno string `json:"errno,omitempty"`
	// Pattern names the exchange pattern that matched.
	Pattern string `json:"pattern,omitempty"`
	// Limit is the limit that was exceeded.
	Limit int64 `json:"limit,omitempty"`
}

func (e *Error) Error() string {
	if e.Data != nil {
		return fmt.Sprintf("%s (%s, code %d)", e.Message, e.Data.Type, e.Code)
	}
	return fmt.Sprintf("%s (code %d)", e.Message, e.Code)
}

func rpcErr(code int, typ, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Data: &ErrorData{Type: typ}}
}

// errFrameTooLarge is returned by readFrame for a line over the limit.
var errFrameTooLarge = errors.New("frame too large")

// readFrame returns the next non-empty newline-terminated frame (without
// the newline), at most max bytes. At the end of the stream a final frame
// without newline is returned; then io.EOF.
func readFrame(r *bufio.Reader, max int) ([]byte, error) {
	for {
		var line []byte
		for {
			chunk, err := r.ReadSlice('\n')
			line = append(line, chunk...)
			n := len(line)
			if err == nil {
				n-- // the newline
			}
			if n > max {
				return nil, errFrameTooLarge
			}
			if err == nil {
				break
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if errors.Is(err, io.EOF) && len(bytes.TrimSpace(line)) > 0 {
				return bytes.TrimRight(line, "\r\n"), nil
			}
			return nil, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(bytes.TrimSpace(line)) > 0 {
			return line, nil
		}
	}
}

// decodeRequest parses one frame strictly: a single JSON object with
// jsonrpc "2.0", a method, optional params (object or array) and an id
// (string, number or null). Unknown members are refused.
func decodeRequest(frame []byte) (*Request, *Error) {
	trimmed := bytes.TrimSpace(frame)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		if len(trimmed) > 0 && trimmed[0] == '[' {
			return nil, rpcErr(CodeInvalidRequest, TypeInvalidRequest, "batch requests are not supported: send one request per line")
		}
		if !json.Valid(trimmed) {
			return nil, rpcErr(CodeParseError, TypeParse, "frame is not valid JSON")
		}
		return nil, rpcErr(CodeInvalidRequest, TypeInvalidRequest, "a request must be a JSON object")
	}
	if !json.Valid(trimmed) {
		return nil, rpcErr(CodeParseError, TypeParse, "frame is not valid JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	var req Request
	if err := dec.Decode(&req); err != nil {
		return nil, rpcErr(CodeInvalidRequest, TypeInvalidRequest, "not a JSON-RPC 2.0 request: %v", err)
	}
	if req.JSONRPC != "2.0" {
		return nil, rpcErr(CodeInvalidRequest, TypeInvalidRequest, `"jsonrpc" must be "2.0"`)
	}
	if req.Method == "" {
		return nil, rpcErr(CodeInvalidRequest, TypeInvalidRequest, `"method" is required`)
	}
	if len(req.ID) > 0 {
		switch c := req.ID[0]; {
		case c == '"', c == '-', c >= '0' && c <= '9':
		case bytes.Equal(req.ID, []byte("null")):
			req.ID = nil
		default:
			return nil, rpcErr(CodeInvalidRequest, TypeInvalidRequest, `"id" must be a string or a number`)
		}
	}
	if p := bytes.TrimSpace(req.Params); len(p) > 0 && p[0] != '{' && p[0] != '[' {
		if bytes.Equal(p, []byte("null")) {
			req.Params = nil
		} else {
			return nil, rpcErr(CodeInvalidRequest, TypeInvalidRequest, `"params" must be an object`)
		}
	}
	return &req, nil
}

// decodeParams decodes params strictly into v.
func decodeParams(raw json.RawMessage, v any) *Error {
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return rpcErr(CodeInvalidParams, TypeInvalidParams, "bad params: %v", err)
	}
	return nil
}
