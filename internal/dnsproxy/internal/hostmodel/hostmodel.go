// Package hostmodel is the character trigram model of real hostname labels
// that the encoded-name detector scores labels against, and the shared
// definition of its symbols and file format (used by the generator too).
//
// Symbols: 0 is the label boundary, 1-26 are a-z (case folded), 27 stands for
// any digit, 28 for '-', 29 for anything else. Digits share one symbol because
// hostnames use digits as counters and numbers whose particular values carry
// no structure; the cost of a specific digit adds log2(10) bits.
package hostmodel

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
)

// Symbols is the size of the model's alphabet.
const Symbols = 30

const (
	symBoundary = 0
	symDigit    = 27
	symHyphen   = 28
	symOther    = 29
)

// Magic starts a model file.
const Magic = "WHM1"

// costScale is the number of cost units per bit in the quantised table.
const costScale = 8

// Extra cost, in bits, of naming the particular character behind a class
// symbol: one of 10 digits, or one of ~32 other byte values.
var (
	digitBits = math.Log2(10)
	otherBits = 5.0
)

// Sym maps a byte to its model symbol.
func Sym(c byte) int {
	switch {
	case c >= 'a' && c <= 'z':
		return int(c-'a') + 1
	case c >= 'A' && c <= 'Z':
		return int(c-'A') + 1
	case c >= '0' && c <= '9':
		return symDigit
	case c == '-':
		return symHyphen
	}
	return symOther
}

// Model holds -log2 P(c | a, b) for every symbol triple, quantised.
type Model struct {
	cost [Symbols * Symbols * Symbols]uint8
}

// Parse decodes a model file.
func Parse(b []byte) (*Model, error) {
	m := &Model{}
	if len(b) != len(Magic)+len(m.cost) || string(b[:len(Magic)]) != Magic {
		return nil, errors.New("hostmodel: not a model file of the expected size")
	}
	copy(m.cost[:], b[len(Magic):])
	return m, nil
}

// Encode returns the model file bytes.
func (m *Model) Encode() []byte {
	return append([]byte(Magic), m.cost[:]...)
}

// Build estimates the model from counts of trigrams (index a*S*S+b*S+c),
// interpolating trigram, bigram and unigram estimates so unseen triples keep
// a finite cost.
func Build(tri []float64) (*Model, error) {
	const S = Symbols
	if len(tri) != S*S*S {
		return nil, fmt.Errorf("hostmodel: need %d trigram counts, got %d", S*S*S, len(tri))
	}
	bi := make([]float64, S*S) // (b,c)
	uni := make([]float64, S)
	ctx2 := make([]float64, S*S) // (a,b) totals
	ctx1 := make([]float64, S)   // b totals
	var total float64
	for a := range S {
		for b := range S {
			for c := range S {
				n := tri[a*S*S+b*S+c]
				bi[b*S+c] += n
				uni[c] += n
				ctx2[a*S+b] += n
				ctx1[b] += n
				total += n
			}
		}
	}
	if total == 0 {
		return nil, errors.New("hostmodel: no training data")
	}
	m := &Model{}
	for a := range S {
		for b := range S {
			for c := range S {
				pu := (uni[c] + 1) / (total + S)
				pb := pu
				if ctx1[b] > 0 {
					pb = bi[b*S+c] / ctx1[b]
				}
				pt := pb
				if ctx2[a*S+b] > 0 {
					pt = tri[a*S*S+b*S+c] / ctx2[a*S+b]
				}
				p := 0.70*pt + 0.25*pb + 0.05*pu
				q := math.Round(-math.Log2(p) * costScale)
				if q > 255 {
					q = 255
				}
				if q < 0 {
					q = 0
				}
				m.cost[a*S*S+b*S+c] = uint8(q)
			}
		}
	}
	return m, nil
}

// Count adds the trigrams of one label (with boundaries) to tri.
func Count(tri []float64, label string, weight float64) {
	const S = Symbols
	a, b := symBoundary, symBoundary
	for i := 0; i <= len(label); i++ {
		c := symBoundary
		if i < len(label) {
			c = Sym(label[i])
		}
		tri[a*S*S+b*S+c] += weight
		a, b = b, c
	}
}

// Bits returns the cost in bits of the label under the model, including the
// end boundary and the choice of particular digits and other bytes.
func (m *Model) Bits(label string) float64 {
	const S = Symbols
	a, b := symBoundary, symBoundary
	var units int
	var extra float64
	for i := 0; i <= len(label); i++ {
		c := symBoundary
		if i < len(label) {
			c = Sym(label[i])
			switch c {
			case symDigit:
				extra += digitBits
			case symOther:
				extra += otherBits
			}
		}
		units += int(m.cost[a*S*S+b*S+c])
		a, b = b, c
	}
	return float64(units)/costScale + extra
}

// Holdout reports whether a registrable domain belongs to the validation
// fifth of the training source, which the generator leaves out so that the
// detector's thresholds can be checked on names the model never saw.
func Holdout(registrable string) bool {
	h := fnv.New32a()
	h.Write([]byte(registrable))
	return h.Sum32()%5 == 0
}
