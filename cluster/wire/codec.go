package wire

//go:generate go run ./internal/gen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The generated AppendTo and Decode methods (codec_gen.go) are a list of
// calls to the helpers below, one a field; gen.go says how each Go field
// type maps to one. The helpers write msgpack as the vmihailenco/msgpack
// encoder did when it wrote these frames (the shortest form of an
// unsigned integer or a length), so that the bytes stay those of every
// earlier release (testdata/golden.txt).

// msgpack's type codes that the messages use.
const (
	posFixMax  = 0x7f
	fixArray   = 0x90
	fixArrayHi = 0x9f
	fixStr     = 0xa0
	fixStrHi   = 0xbf
	codeNil    = 0xc0
	codeFalse  = 0xc2
	codeTrue   = 0xc3
	bin8       = 0xc4
	bin16      = 0xc5
	bin32      = 0xc6
	uint8Code  = 0xcc
	uint16Code = 0xcd
	uint32Code = 0xce
	uint64Code = 0xcf
	int8Code   = 0xd0
	int16Code  = 0xd1
	int32Code  = 0xd2
	int64Code  = 0xd3
	str8       = 0xd9
	str16      = 0xda
	str32      = 0xdb
	array16    = 0xdc
	array32    = 0xdd
	negFixMin  = 0xe0
)

// appendHead appends a type code and a length or value in the shortest
// of its 1-, 2- and 4-byte forms (code8 may be 0: no 1-byte form).
func appendHead(b []byte, code8, code16, code32 byte, n uint32) []byte {
	switch {
	case code8 != 0 && n <= math.MaxUint8:
		return append(b, code8, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, code16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, code32), n)
}

func appendArray(b []byte, n int) []byte {
	if n < 16 {
		return append(b, fixArray|byte(n))
	}
	return appendHead(b, 0, array16, array32, uint32(n))
}

// appendUint appends v in the fewest bytes.
func appendUint(b []byte, v uint64) []byte {
	switch {
	case v <= posFixMax:
		return append(b, byte(v))
	case v <= math.MaxUint32:
		return appendHead(b, uint8Code, uint16Code, uint32Code, uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, uint64Code), v)
}

func appendStr(b []byte, s string) []byte {
	if len(s) < 32 {
		b = append(b, fixStr|byte(len(s)))
	} else {
		b = appendHead(b, str8, str16, str32, uint32(len(s)))
	}
	return append(b, s...)
}

func appendBin(b, p []byte) []byte {
	return append(appendHead(b, bin8, bin16, bin32, uint32(len(p))), p...)
}

// appendBool01 appends a bool as the messages carry it: 0 or 1.
func appendBool01(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func appendBins(b []byte, ps [][]byte) []byte {
	b = appendArray(b, len(ps))
	for _, p := range ps {
		b = appendBin(b, p)
	}
	return b
}

func appendStrs(b []byte, ss []string) []byte {
	b = appendArray(b, len(ss))
	for _, s := range ss {
		b = appendStr(b, s)
	}
	return b
}

func appendUints(b []byte, vs []uint64) []byte {
	b = appendArray(b, len(vs))
	for _, v := range vs {
		b = appendUint(b, v)
	}
	return b
}

// appendKVs appends key, value, key, value...
func appendKVs(b []byte, kvs []KV) []byte {
	b = appendArray(b, 2*len(kvs))
	for _, kv := range kvs {
		b = appendBin(appendStr(b, kv.Key), kv.Val)
	}
	return b
}

// The typed forms (a //wire:message typed struct) are those msgpack's
// reflection writes for a struct encoded as an array: an integer keeps its
// Go type's width, a bool is msgpack's, and a nil slice or pointer is nil.

func appendInt64(b []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(append(b, int64Code), uint64(v))
}

func appendUint8(b []byte, v uint8) []byte { return append(b, uint8Code, v) }

func appendUint32(b []byte, v uint32) []byte {
	return binary.BigEndian.AppendUint32(append(b, uint32Code), v)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, codeTrue)
	}
	return append(b, codeFalse)
}

func appendNilBin(b, p []byte) []byte {
	if p == nil {
		return append(b, codeNil)
	}
	return appendBin(b, p)
}

func appendNilUint8(b []byte, p *uint8) []byte {
	if p == nil {
		return append(b, codeNil)
	}
	return appendUint8(b, *p)
}

func appendNilStrs(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, codeNil)
	}
	return appendStrs(b, ss)
}

// decoder reads msgpack from src, checking every declared length against
// the bytes left before it allocates or slices. Its first error sticks:
// every later read returns a zero value, and Decode reports err once.
type decoder struct {
	src []byte
	off int
	err error
}

var errShort = errors.New("wire: message ends early")

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) left() int { return len(d.src) - d.off }

// next returns the next n bytes, or nil (and the error) when fewer are left.
func (d *decoder) next(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > d.left() {
		d.err = errShort
		return nil
	}
	p := d.src[d.off : d.off+n : d.off+n]
	d.off += n
	return p
}

// code reads the next type code.
func (d *decoder) code() byte {
	if p := d.next(1); p != nil {
		return p[0]
	}
	return 0
}

// peekNil reads a nil if one is next.
func (d *decoder) peekNil() bool {
	if d.err == nil && d.left() > 0 && d.src[d.off] == codeNil {
		d.off++
		return true
	}
	return false
}

// be reads an n-byte big-endian number.
func (d *decoder) be(n int) uint64 {
	var v uint64
	for _, c := range d.next(n) {
		v = v<<8 | uint64(c)
	}
	return v
}

// bound checks a declared length or count against the bytes left, each
// byte or value taking one at least, before anything is sliced or
// allocated for it (in uint64: a 32-bit int would wrap).
func (d *decoder) bound(n uint64) int {
	if d.err == nil && n > uint64(d.left()) {
		d.fail(fmt.Errorf("wire: %d declared, %d bytes left", n, d.left()))
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

// length reads the 1-, 2- or 4-byte length that follows a code of a family.
func (d *decoder) length(c, code8, code16, code32 byte) int {
	switch c {
	case code8:
		return d.bound(d.be(1))
	case code16:
		return d.bound(d.be(2))
	case code32:
		return d.bound(d.be(4))
	}
	d.fail(fmt.Errorf("wire: unexpected code 0x%02x", c))
	return 0
}

func (d *decoder) arrayLen() int {
	c := d.code()
	switch {
	case d.err != nil:
		return 0
	case c == codeNil:
		d.fail(errors.New("wire: want an array, got nil"))
		return 0
	case c >= fixArray && c <= fixArrayHi:
		return d.bound(uint64(c & 0x0f))
	case c == array16:
		return d.bound(d.be(2))
	case c == array32:
		return d.bound(d.be(4))
	}
	d.fail(fmt.Errorf("wire: want an array, got code 0x%02x", c))
	return 0
}

// array reads an array header that must hold exactly n fields.
func (d *decoder) array(n int) {
	if got := d.arrayLen(); d.err == nil && got != n {
		d.fail(fmt.Errorf("wire: %d fields, want %d", got, n))
	}
}

// arrayOr reads the header of a message whose optional trailing fields
// came later: it holds either short fields (its older form) or all; it
// reports whether the optional ones follow.
func (d *decoder) arrayOr(short, all int) bool {
	got := d.arrayLen()
	if d.err == nil && got != short && got != all {
		d.fail(fmt.Errorf("wire: %d fields, want %d or %d", got, short, all))
	}
	return d.err == nil && got == all
}

// present checks that the first optional field of a message that carries
// them is not empty: the encoder leaves them all out when it is.
func (d *decoder) present(ok bool, field string) {
	if !ok {
		d.fail(fmt.Errorf("wire: an empty %s", field))
	}
}

func (d *decoder) uint(max uint64) uint64 {
	c := d.code()
	var v uint64
	switch {
	case d.err != nil:
		return 0
	case c <= posFixMax:
		v = uint64(c)
	case c == uint8Code:
		v = d.be(1)
	case c == uint16Code:
		v = d.be(2)
	case c == uint32Code:
		v = d.be(4)
	case c == uint64Code:
		v = d.be(8)
	default:
		d.fail(fmt.Errorf("wire: want an unsigned integer, got code 0x%02x", c))
	}
	if d.err == nil && v > max {
		d.fail(fmt.Errorf("wire: %d is above %d", v, max))
	}
	if d.err != nil {
		return 0
	}
	return v
}

func (d *decoder) bool01() bool { return d.uint(1) == 1 }

// raw reads a str or bin as a sub-slice of src.
func (d *decoder) raw(str bool) []byte {
	c := d.code()
	var n int
	switch {
	case d.err != nil:
		return nil
	case str && c >= fixStr && c <= fixStrHi:
		n = d.bound(uint64(c & 0x1f))
	case str:
		n = d.length(c, str8, str16, str32)
	default:
		n = d.length(c, bin8, bin16, bin32)
	}
	return d.next(n)
}

func (d *decoder) str() string { return string(d.raw(true)) }

// bin reads a bin as a copy, nil when empty.
func (d *decoder) bin() []byte {
	if p := d.raw(false); len(p) > 0 {
		return append([]byte(nil), p...)
	}
	return nil
}

// bins reads a list of bins as sub-slices of src, nil when empty.
func (d *decoder) bins() [][]byte {
	n := d.arrayLen()
	if n == 0 {
		return nil
	}
	out := make([][]byte, n)
	for i := range out {
		out[i] = d.raw(false)
	}
	return out
}

func (d *decoder) strs() []string {
	var out []string
	for range d.arrayLen() {
		if s := d.str(); d.err == nil {
			out = append(out, s)
		}
	}
	return out
}

func (d *decoder) uints() []uint64 {
	var out []uint64
	for range d.arrayLen() {
		if v := d.uint(math.MaxUint64); d.err == nil {
			out = append(out, v)
		}
	}
	return out
}

// kvs reads pairs; values are copied (they outlive the frame buffer) and
// never nil.
func (d *decoder) kvs() []KV {
	n := d.arrayLen()
	if n%2 != 0 {
		d.fail(fmt.Errorf("wire: %d values in a key-value list", n))
	}
	var out []KV
	for i := 0; i < n/2 && d.err == nil; i++ {
		k := d.str()
		v := d.raw(false)
		if d.err == nil {
			out = append(out, KV{k, append([]byte{}, v...)})
		}
	}
	return out
}

// int64 reads any msgpack integer that fits.
func (d *decoder) int64() int64 {
	c := d.code()
	switch {
	case d.err != nil:
		return 0
	case c <= posFixMax || c >= negFixMin:
		return int64(int8(c))
	case c == int8Code:
		return int64(int8(d.be(1)))
	case c == int16Code:
		return int64(int16(d.be(2)))
	case c == int32Code:
		return int64(int32(d.be(4)))
	case c == int64Code:
		return int64(d.be(8))
	}
	d.off--
	v := d.uint(math.MaxInt64)
	return int64(v)
}

func (d *decoder) boolean() bool {
	switch c := d.code(); {
	case d.err != nil:
	case c == codeTrue:
		return true
	case c != codeFalse:
		d.fail(fmt.Errorf("wire: want a bool, got code 0x%02x", c))
	}
	return false
}

// nilBin reads nil or a bin, copied (empty, not nil, when empty).
func (d *decoder) nilBin() []byte {
	if d.peekNil() {
		return nil
	}
	p := d.raw(false)
	if d.err != nil {
		return nil
	}
	return append([]byte{}, p...)
}

func (d *decoder) nilUint8() *uint8 {
	if d.peekNil() {
		return nil
	}
	v := uint8(d.uint(math.MaxUint8))
	if d.err != nil {
		return nil
	}
	return &v
}

// nilStrs reads nil or a list of strings (empty, not nil, when empty).
func (d *decoder) nilStrs() []string {
	if d.peekNil() {
		return nil
	}
	out := d.strs()
	if d.err == nil && out == nil {
		out = []string{}
	}
	return out
}

// end checks nothing follows the message.
func (d *decoder) end() {
	if d.err == nil && d.left() != 0 {
		d.fail(fmt.Errorf("wire: %d bytes after the message", d.left()))
	}
}
