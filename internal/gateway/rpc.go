package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/watcherhq/watcher/pkg/toolproto"
)

func rpcErr(code int, typ, format string, args ...any) *toolproto.Error {
	return &toolproto.Error{Code: code, Message: fmt.Sprintf(format, args...), Data: &toolproto.ErrorData{Type: typ}}
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
func decodeRequest(frame []byte) (*toolproto.Request, *toolproto.Error) {
	trimmed := bytes.TrimSpace(frame)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		if len(trimmed) > 0 && trimmed[0] == '[' {
			return nil, rpcErr(toolproto.CodeInvalidRequest, toolproto.TypeInvalidRequest, "batch requests are not supported: send one request per line")
		}
		if !json.Valid(trimmed) {
			return nil, rpcErr(toolproto.CodeParseError, toolproto.TypeParse, "frame is not valid JSON")
		}
		return nil, rpcErr(toolproto.CodeInvalidRequest, toolproto.TypeInvalidRequest, "a request must be a JSON object")
	}
	if !json.Valid(trimmed) {
		return nil, rpcErr(toolproto.CodeParseError, toolproto.TypeParse, "frame is not valid JSON")
	}
	// The params are checked by their method's decoder.
	if err := checkJSON(trimmed, "params"); err != nil {
		return nil, rpcErr(toolproto.CodeInvalidRequest, toolproto.TypeInvalidRequest, "not a JSON-RPC 2.0 request: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	var req toolproto.Request
	if err := dec.Decode(&req); err != nil {
		return nil, rpcErr(toolproto.CodeInvalidRequest, toolproto.TypeInvalidRequest, "not a JSON-RPC 2.0 request: %v", err)
	}
	if req.JSONRPC != "2.0" {
		return nil, rpcErr(toolproto.CodeInvalidRequest, toolproto.TypeInvalidRequest, `"jsonrpc" must be "2.0"`)
	}
	if req.Method == "" {
		return nil, rpcErr(toolproto.CodeInvalidRequest, toolproto.TypeInvalidRequest, `"method" is required`)
	}
	if len(req.ID) > 0 {
		switch c := req.ID[0]; {
		case c == '"', c == '-', c >= '0' && c <= '9':
		case bytes.Equal(req.ID, []byte("null")):
			req.ID = nil
		default:
			return nil, rpcErr(toolproto.CodeInvalidRequest, toolproto.TypeInvalidRequest, `"id" must be a string or a number`)
		}
	}
	if p := bytes.TrimSpace(req.Params); len(p) > 0 && p[0] != '{' && p[0] != '[' {
		if bytes.Equal(p, []byte("null")) {
			req.Params = nil
		} else {
			return nil, rpcErr(toolproto.CodeInvalidRequest, toolproto.TypeInvalidRequest, `"params" must be an object`)
		}
	}
	return &req, nil
}

// decodeParams decodes params strictly into v: no unknown member, and
// nothing two decoders could read differently (checkJSON; refused as
// TypeAmbiguousArguments). Every method's params and every tool's
// arguments are decoded here.
func decodeParams(raw json.RawMessage, v any) *toolproto.Error {
	return decodeParamsSkipping(raw, v, "")
}

// decodeParamsSkipping is decodeParams leaving the value of the top-level
// member skip unchecked (its own decoder checks it).
func decodeParamsSkipping(raw json.RawMessage, v any, skip string) *toolproto.Error {
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	if err := checkJSON(raw, skip); err != nil {
		return rpcErr(toolproto.CodeInvalidParams, toolproto.TypeAmbiguousArguments, "refused: %v: send each key once, in one spelling, as valid UTF-8", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return rpcErr(toolproto.CodeInvalidParams, toolproto.TypeInvalidParams, "bad params: %v", err)
	}
	return nil
}
