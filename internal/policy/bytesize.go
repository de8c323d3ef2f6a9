package policy

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ByteSize is a number of bytes written as an integer or with a binary
// suffix: "512K", "1.5G", "2GiB", "100M" (K, M, G, T are powers of 1024).
type ByteSize struct {
	// Bytes is the size.
	Bytes int64
	// invalid holds text that did not parse; Validate reports it with its
	// line.
	invalid string
}

// Bytes returns a ByteSize of n bytes.
func Bytes(n int64) ByteSize { return ByteSize{Bytes: n} }

// ParseByteSize parses "2G", "512MiB", "1.5g" or "4096".
func ParseByteSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	u := strings.ToUpper(t)
	u = strings.TrimSuffix(strings.TrimSuffix(u, "IB"), "B")
	mult := 1.0
	if n := len(u); n > 0 {
		switch u[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			u = u[:n-1]
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(u), 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f*mult > math.MaxInt64/2 {
		return 0, fmt.Errorf("%q is not a size (want e.g. 512M, 1.5G, 2GiB or a number of bytes)", s)
	}
	return int64(f * mult), nil
}

// UnmarshalYAML accepts a size string or a number of bytes.
func (b *ByteSize) UnmarshalYAML(unmarshal func(any) error) error {
	var v any
	if err := unmarshal(&v); err != nil {
		return err
	}
	*b = ByteSize{}
	switch x := v.(type) {
	case string:
		n, err := ParseByteSize(x)
		if err != nil {
			b.invalid = err.Error()
			return nil
		}
		b.Bytes = n
	case uint64:
		b.Bytes = int64(min(x, math.MaxInt64/2))
	case int64:
		b.Bytes = x
	case int:
		b.Bytes = int64(x)
	case float64:
		b.Bytes = int64(x)
	case nil:
	default:
		b.invalid = fmt.Sprintf("%v is not a size (want e.g. 512M, 1.5G)", v)
	}
	if b.Bytes < 0 {
		b.invalid = fmt.Sprintf("%d: a size must not be negative", b.Bytes)
	}
	return nil
}

// MarshalYAML writes the size as a number of bytes.
func (b ByteSize) MarshalYAML() (any, error) { return b.Bytes, nil }

// String formats the size with a binary suffix.
func (b ByteSize) String() string { return FormatBytes(b.Bytes) }

// FormatBytes formats n bytes for people: 1.5G, 300M, 12K, 80B.
func FormatBytes(n int64) string {
	units := []struct {
		s string
		v float64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}}
	for _, u := range units {
		if float64(n) >= u.v {
			return strconv.FormatFloat(float64(n)/u.v, 'g', 3, 64) + u.s
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
