package toolproto

import (
	"encoding/json"
	"time"
)

// ToolInfo is one entry of tool.list.
type ToolInfo struct {
	Tool   string `json:"tool"`
	Action string `json:"action"` // allow or ask
	Rule   string `json:"rule"`
}

// ToolList is what tool.list returns.
type ToolList struct {
	Sandbox   string     `json:"sandbox"`
	Tools     []ToolInfo `json:"tools"`
	Workspace []string   `json:"workspace,omitempty"`
	Exchange  bool       `json:"exchange"`
	Limits    Limits     `json:"limits"`
}

// Limits are the sandbox's call limits.
type Limits struct {
	MaxRequestBytes  int     `json:"max_request_bytes"`
	MaxArgumentBytes int     `json:"max_argument_bytes"`
	MaxOutputBytes   int     `json:"max_output_bytes"`
	Rate             float64 `json:"rate,omitempty"`
	Burst            int     `json:"burst,omitempty"`
	MaxInFlight      int     `json:"max_in_flight,omitempty"`
	AskTimeoutSec    float64 `json:"ask_timeout_seconds"`
}

// ToolParams are tool.request's parameters.
type ToolParams struct {
	// CallID names the call in its session (1-64 of letters, digits,
	// '_', '.', '-'); a used id is refused (TypeDuplicateCall).
	CallID    string          `json:"call_id"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	// Session groups calls for session.resume ("default" when empty).
	Session string `json:"session"`
}

// CallResult is what tool.request (and exchange.put and exchange.get)
// return: the call's number in its session and the tool's output.
type CallResult struct {
	CallID  string          `json:"call_id"`
	Session string          `json:"session"`
	Seq     uint64          `json:"seq"`
	Tool    string          `json:"tool"`
	Output  json.RawMessage `json:"output"`
}

// ResumeParams are session.resume's parameters.
type ResumeParams struct {
	Session  string `json:"session"`
	AfterSeq uint64 `json:"after_seq"`
}

// Resumed is what session.resume returns.
type Resumed struct {
	Session string   `json:"session"`
	LastSeq uint64   `json:"last_seq"`
	Actions []Action `json:"actions"`
}

// Action is one call of a session as session.resume returns it.
type Action struct {
	Seq       uint64          `json:"seq"`
	CallID    string          `json:"call_id"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	Time      time.Time       `json:"time"`
	// Decision is allow, deny or ask; Rule the rule that decided.
	Decision string `json:"decision,omitempty"`
	Rule     string `json:"rule,omitempty"`
	// Approval is set for calls that asked.
	Approval *Answer `json:"approval,omitempty"`
	// Status is running, ok, error or interrupted.
	Status string          `json:"status"`
	Output json.RawMessage `json:"output,omitempty"`
	// OutputDropped says the output (and arguments) were forgotten to
	// bound memory (the ledger keeps the call's records and hashes).
	OutputDropped bool   `json:"output_dropped,omitempty"`
	Error         *Error `json:"error,omitempty"`
}

// Answer is what became of a call that asked for approval.
type Answer struct {
	Approved bool   `json:"approved"`
	TimedOut bool   `json:"timed_out,omitempty"`
	By       string `json:"by,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// ExchangeParams are exchange.put's and exchange.get's parameters.
type ExchangeParams struct {
	Name    string `json:"name"`
	Content string `json:"content,omitempty"`
	CallID  string `json:"call_id,omitempty"`
	Session string `json:"session"`
}

// ExchangeResult is the output of exchange.put and exchange.get.
type ExchangeResult struct {
	Name    string `json:"name"`
	Bytes   int    `json:"bytes"`
	SHA256  string `json:"sha256"`
	Content string `json:"content,omitempty"`
	// Untrusted marks content another agent wrote: data, never
	// instructions.
	Untrusted bool   `json:"untrusted,omitempty"`
	Note      string `json:"note,omitempty"`
}
