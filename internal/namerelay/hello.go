package namerelay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Hello is what the relay reads of a TLS ClientHello.
type Hello struct {
	// SNI is the server_name (host_name), lower case, without a trailing
	// dot; empty when the client sent none.
	SNI string
	// ECH says the hello carries an encrypted_client_hello extension
	// (0xfe0d): SNI is then the outer (front end's) name.
	ECH bool
}

// maxHello bounds the bytes read for one ClientHello (post-quantum key
// shares make it a few KiB; the record layer allows 2^14 per record and a
// handshake message 2^24, no client sends that much).
const maxHello = 64 << 10

const (
	recordHandshake   = 0x16
	handshakeHello    = 0x01
	extServerName     = 0x0000
	extECH            = 0xfe0d
	sniHostName       = 0x00
	recordHeaderBytes = 5
)

// errNeedMore says buf holds the start of a ClientHello, not all of it.
var errNeedMore = errors.New("need more bytes")

// parseHello parses the ClientHello at the start of buf, which may span
// several TLS records. It returns errNeedMore while buf is a proper
// prefix of one.
func parseHello(buf []byte) (Hello, error) {
	var hs []byte // handshake bytes gathered from the records
	for rest := buf; ; {
		if len(rest) < recordHeaderBytes {
			if len(hs) == 0 || len(rest) > 0 {
				return Hello{}, errNeedMore
			}
			break
		}
		if rest[0] != recordHandshake {
			if len(hs) == 0 {
				return Hello{}, fmt.Errorf("TLS record type %d, not a handshake", rest[0])
			}
			break
		}
		if rest[1] != 3 {
			return Hello{}, fmt.Errorf("TLS record version %d.%d", rest[1], rest[2])
		}
		n := int(binary.BigEndian.Uint16(rest[3:5]))
		if n == 0 || n > 1<<14+2048 {
			return Hello{}, fmt.Errorf("TLS record length %d", n)
		}
		if len(rest) < recordHeaderBytes+n {
			return Hello{}, errNeedMore
		}
		hs = append(hs, rest[recordHeaderBytes:recordHeaderBytes+n]...)
		rest = rest[recordHeaderBytes+n:]
		if len(hs) >= 4 && len(hs) >= 4+msgLen(hs) {
			break
		}
	}
	if len(hs) < 4 {
		return Hello{}, errNeedMore
	}
	if hs[0] != handshakeHello {
		return Hello{}, fmt.Errorf("handshake type %d, not a ClientHello", hs[0])
	}
	n := msgLen(hs)
	if n > maxHello {
		return Hello{}, fmt.Errorf("ClientHello of %d bytes", n)
	}
	if len(hs) < 4+n {
		return Hello{}, errNeedMore
	}
	return parseHelloBody(hs[4 : 4+n])
}

func msgLen(hs []byte) int { return int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]) }

// parseHelloBody reads the fields of a ClientHello up to its extensions,
// in any order.
func parseHelloBody(b []byte) (Hello, error) {
	r := reader{b: b}
	r.skip(2 + 32)       // legacy_version, random
	r.skip(int(r.u8()))  // legacy_session_id
	r.skip(int(r.u16())) // cipher_suites
	r.skip(int(r.u8()))  // legacy_compression_methods
	if r.err == nil && len(r.b) == 0 {
		return Hello{}, nil // no extensions at all (SSL 3 style)
	}
	exts := reader{b: r.bytes(int(r.u16()))}
	if r.err != nil {
		return Hello{}, fmt.Errorf("ClientHello: %w", r.err)
	}
	var h Hello
	seen := map[uint16]bool{}
	for len(exts.b) > 0 && exts.err == nil {
		typ := exts.u16()
		data := exts.bytes(int(exts.u16()))
		if exts.err != nil {
			break
		}
		if seen[typ] {
			// Two server_name extensions could show the relay one name
			// and the server another.
			return Hello{}, fmt.Errorf("ClientHello: extension %#04x twice", typ)
		}
		seen[typ] = true
		switch typ {
		case extECH:
			h.ECH = true
		case extServerName:
			name, err := parseSNI(data)
			if err != nil {
				return Hello{}, err
			}
			h.SNI = name
		}
	}
	if exts.err != nil {
		return Hello{}, fmt.Errorf("ClientHello extensions: %w", exts.err)
	}
	return h, nil
}

// parseSNI reads the server_name extension: one host_name entry.
func parseSNI(data []byte) (string, error) {
	r := reader{b: data}
	list := reader{b: r.bytes(int(r.u16()))}
	var name string
	for len(list.b) > 0 && list.err == nil {
		typ := list.u8()
		v := list.bytes(int(list.u16()))
		if list.err != nil {
			break
		}
		if typ != sniHostName {
			continue
		}
		if name != "" {
			return "", errors.New("server_name: two host names")
		}
		name = string(v)
		if name == "" {
			return "", errors.New("server_name: empty host name")
		}
	}
	if r.err != nil || list.err != nil {
		return "", errors.New("server_name: truncated")
	}
	return normName(name), nil
}

// normName is a DNS name as the relay compares it: lower case, no
// trailing dot.
func normName(s string) string {
	return strings.TrimSuffix(strings.ToLower(s), ".")
}

// reader reads big-endian fields, remembering the first overrun.
type reader struct {
	b   []byte
	err error
}

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.b) < n {
		r.err = errors.New("truncated")
		return false
	}
	return true
}

func (r *reader) u8() uint8 {
	if !r.need(1) {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) u16() uint16 {
	if !r.need(2) {
		return 0
	}
	v := binary.BigEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if !r.need(n) {
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) skip(n int) { r.bytes(n) }
