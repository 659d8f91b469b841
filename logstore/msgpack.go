package logstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// A minimal msgpack (https://msgpack.org/) encoder and decoder for the
// record value: the types it needs, append-style so encoding allocates
// nothing, and a decoder that checks every length against the input so
// corrupt bytes give an error, never a panic or a huge allocation. Values
// are standard msgpack: vmihailenco/msgpack decodes them (see codec_test.go).

const mpNil = 0xc0

func appendArrayLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
	}
}

func appendUint(b []byte, v uint64) []byte {
	switch {
	case v < 128:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
	}
}

func appendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
	}
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func appendBin(b []byte, p []byte) []byte {
	n := len(p)
	switch {
	case n <= math.MaxUint8:
		b = append(b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
	}
	return append(b, p...)
}

var errTruncated = errors.New("msgpack: unexpected end of value")

// mpDecoder reads from b; the first error sticks and later reads return
// zero values.
type mpDecoder struct {
	b   []byte
	err error
}

func (d *mpDecoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("msgpack: "+format, args...)
	}
}

func (d *mpDecoder) byte1() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.err = errTruncated
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *mpDecoder) take(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errTruncated
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *mpDecoder) be(n int) uint64 {
	p := d.take(uint64(n))
	var v uint64
	for _, c := range p {
		v = v<<8 | uint64(c)
	}
	return v
}

func (d *mpDecoder) arrayLen() int {
	c := d.byte1()
	var n uint64
	switch {
	case d.err != nil:
		return 0
	case c&0xf0 == 0x90:
		n = uint64(c & 0x0f)
	case c == 0xdc:
		n = d.be(2)
	case c == 0xdd:
		n = d.be(4)
	default:
		d.fail("want an array, got code 0x%02x", c)
		return 0
	}
	if n > uint64(len(d.b)) { // every element takes at least one byte
		d.fail("array of %d elements in %d bytes", n, len(d.b))
		return 0
	}
	return int(n)
}

// int reads any msgpack integer that fits in an int64.
func (d *mpDecoder) int() int64 {
	c := d.byte1()
	switch {
	case d.err != nil:
		return 0
	case c <= 0x7f:
		return int64(c)
	case c >= 0xe0:
		return int64(int8(c))
	}
	switch c {
	case 0xcc:
		return int64(d.be(1))
	case 0xcd:
		return int64(d.be(2))
	case 0xce:
		return int64(d.be(4))
	case 0xcf:
		v := d.be(8)
		if v > math.MaxInt64 {
			d.fail("integer %d overflows int64", v)
		}
		return int64(v)
	case 0xd0:
		return int64(int8(d.be(1)))
	case 0xd1:
		return int64(int16(d.be(2)))
	case 0xd2:
		return int64(int32(d.be(4)))
	case 0xd3:
		return int64(d.be(8))
	}
	d.fail("want an integer, got code 0x%02x", c)
	return 0
}

// uint reads a non-negative integer no larger than max.
func (d *mpDecoder) uint(max uint64) uint64 {
	v := d.int()
	if d.err == nil && (v < 0 || uint64(v) > max) {
		d.fail("integer %d out of range [0, %d]", v, max)
		return 0
	}
	return uint64(v)
}

func (d *mpDecoder) strBytes() []byte {
	c := d.byte1()
	switch {
	case d.err != nil:
		return nil
	case c&0xe0 == 0xa0:
		return d.take(uint64(c & 0x1f))
	case c == 0xd9:
		return d.take(d.be(1))
	case c == 0xda:
		return d.take(d.be(2))
	case c == 0xdb:
		return d.take(d.be(4))
	}
	d.fail("want a string, got code 0x%02x", c)
	return nil
}

func (d *mpDecoder) str() string { return string(d.strBytes()) }

// bin reads binary data (or nil) into a new slice; nil for length 0.
func (d *mpDecoder) bin() []byte {
	if d.nilValue() {
		return nil
	}
	c := d.byte1()
	var p []byte
	switch {
	case d.err != nil:
		return nil
	case c == 0xc4:
		p = d.take(d.be(1))
	case c == 0xc5:
		p = d.take(d.be(2))
	case c == 0xc6:
		p = d.take(d.be(4))
	default:
		d.fail("want binary data, got code 0x%02x", c)
	}
	if len(p) == 0 {
		return nil
	}
	return append([]byte(nil), p...)
}

// nilValue consumes a nil and reports whether there was one.
func (d *mpDecoder) nilValue() bool {
	if d.err == nil && len(d.b) > 0 && d.b[0] == mpNil {
		d.b = d.b[1:]
		return true
	}
	return false
}

// skip consumes one value of any type (for fields a newer writer added).
func (d *mpDecoder) skip() { d.skipDepth(0) }

func (d *mpDecoder) skipDepth(depth int) {
	if depth > 32 {
		d.fail("values nested deeper than 32")
		return
	}
	if d.err != nil || len(d.b) == 0 {
		d.take(1)
		return
	}
	c := d.b[0]
	var elems uint64 // array/map elements to skip after the header
	switch {
	case c <= 0x7f || c >= 0xe0 || c == mpNil || c == 0xc2 || c == 0xc3:
		d.take(1)
	case c&0xe0 == 0xa0, c == 0xd9, c == 0xda, c == 0xdb:
		d.strBytes()
	case c == 0xc4, c == 0xc5, c == 0xc6:
		d.bin()
	case c >= 0xcc && c <= 0xd3:
		d.int()
	case c == 0xca:
		d.take(5)
	case c == 0xcb:
		d.take(9)
	case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16
		d.take(2 + uint64(1)<<(c-0xd4))
	case c == 0xc7, c == 0xc8, c == 0xc9:
		d.take(1)
		n := d.be(1 << (c - 0xc7))
		d.take(1 + n)
	case c&0xf0 == 0x90, c == 0xdc, c == 0xdd:
		elems = uint64(d.arrayLen())
	case c&0xf0 == 0x80:
		d.take(1)
		elems = 2 * uint64(c&0x0f)
	case c == 0xde, c == 0xdf:
		d.take(1)
		elems = 2 * d.be(2<<(c-0xde))
	default:
		d.fail("unknown code 0x%02x", c)
	}
	if elems > uint64(len(d.b)) {
		d.fail("container of %d values in %d bytes", elems, len(d.b))
		return
	}
	for i := uint64(0); i < elems && d.err == nil; i++ {
		d.skipDepth(depth + 1)
	}
}
