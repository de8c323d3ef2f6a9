// Package toolproto is the wire format of watcher's tool-call gateway: the
// JSON-RPC 2.0 frames a sandbox's agent exchanges with the gateway socket
// (one request per line), its typed errors, each method's parameters and
// each tool's result. The gateway (internal/gateway) serves these types
// and pkg/toolclient sends them; programs in other languages can read
// this file as the protocol's reference.
//
// Methods: tool.list (ToolList), tool.request (ToolParams → CallResult,
// whose Output is the tool's result: FileContent, WriteResult, Listing,
// ShellResult), session.resume (ResumeParams → Resumed), exchange.put and
// exchange.get (ExchangeParams → CallResult with an ExchangeResult).
package toolproto

import (
	"encoding/json"
	"fmt"
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
		return fmt.Sprintf("gateway: %s (%s, code %d)", e.Message, e.Data.Type, e.Code)
	}
	return fmt.Sprintf("gateway: %s (code %d)", e.Message, e.Code)
}

// Type is the error's type (Data.Type; "" without data).
func (e *Error) Type() string {
	if e.Data == nil {
		return ""
	}
	return e.Data.Type
}

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
	// TypeAmbiguousArguments: params or arguments decoders could read
	// differently (a key twice, keys equal but for case, invalid UTF-8, a
	// lone surrogate escape, data after the value, an out-of-range number).
	TypeAmbiguousArguments = "ambiguous_arguments"
	// TypeTooLargeForApproval: a call the policy holds for approval has
	// more argument bytes than an approver is shown whole (Data.Limit).
	TypeTooLargeForApproval = "too_large_for_approval"
)
