package logstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The record body (see doc.go; codec.go maps Record fields to it) is written
// and read with vmihailenco/msgpack's streaming Encoder and Decoder, without
// reflection. This file holds the pooled encoder and decoder and the little
// the library does not do for us:
//
//   - keep the first encoder's bytes: an empty or nil payload is bin8 of
//     length 0 (EncodeBytes writes nil for a nil slice), and a negative
//     integer below -32 is int64 (EncodeInt picks int8..int32);
//   - bound every length by the bytes left: DecodeBytes allocates the declared
//     length up front (4 GiB for a corrupt bin32), and DecodeString and Skip
//     allocate up to 1 MiB before finding out the value is shorter;
//   - bound nesting when skipping unknown fields: Skip recurses once per
//     level, so a value of nested one-element arrays would overflow the stack.

// appendWriter is the io.Writer and io.ByteWriter the encoder writes to: it
// appends to b, so the body lands right after the header in the caller's
// buffer, growing it as append does. It never fails.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *appendWriter) WriteByte(c byte) error {
	w.b = append(w.b, c)
	return nil
}

type recordEncoder struct {
	w   appendWriter
	enc *msgpack.Encoder
}

var recordEncoders = sync.Pool{New: func() any {
	e := new(recordEncoder)
	e.enc = msgpack.NewEncoder(&e.w)
	return e
}}

// appendBody appends the msgpack array of the first n fields of r to dst.
func appendBody(dst []byte, r *Record, n int) []byte {
	e := recordEncoders.Get().(*recordEncoder)
	e.w.b = dst
	err := e.body(r, n)
	dst = e.w.b
	e.w.b = nil // do not pin the caller's buffer in the pool
	recordEncoders.Put(e)
	if err != nil {
		// Only the writer can make the encoder fail, and appendWriter does not.
		panic(fmt.Sprintf("logstore: msgpack encoder failed on a memory buffer: %v", err))
	}
	return dst
}

// int writes v as the first encoder did: the shortest form for v >= -32,
// int64 below (the library would pick int8, int16 or int32).
func (e *recordEncoder) int(v int64) error {
	if v < -32 {
		return e.enc.EncodeInt64(v)
	}
	return e.enc.EncodeInt(v)
}

// bin writes p as bin, also when it is nil (the library would write nil).
func (e *recordEncoder) bin(p []byte) error {
	if p == nil {
		return e.enc.EncodeBytesLen(0)
	}
	return e.enc.EncodeBytes(p)
}

// maxSkipDepth bounds the nesting of an unknown field's value.
const maxSkipDepth = 32

var errTruncated = errors.New("value ends early")

// recordDecoder reads a record body from src through the library's Decoder
// on a bytes.Reader (a ByteScanner, so the Decoder adds no buffering and the
// reader's position is the Decoder's).
type recordDecoder struct {
	src []byte
	r   bytes.Reader
	dec *msgpack.Decoder
}

var recordDecoders = sync.Pool{New: func() any {
	d := new(recordDecoder)
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}}

// decodeBody decodes the msgpack array b into r. Strings and byte slices are
// copied: b may be Badger's memory, valid only in its callback.
func decodeBody(r *Record, b []byte) error {
	d := recordDecoders.Get().(*recordDecoder)
	d.src = b
	d.r.Reset(b) // the Decoder reads d.r since NewDecoder: no Decoder.Reset
	err := d.record(r)
	d.src = nil
	d.r.Reset(nil)
	recordDecoders.Put(d)
	return err
}

// eof says "value ends early" for the reader's io.EOF and io.ErrUnexpectedEOF.
func eof(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errTruncated
	}
	return err
}

// peek returns the next code without consuming it. It reads src directly:
// the library's PeekCode costs two calls through the reader interface, and
// the decoder checks up to two codes per field.
func (d *recordDecoder) peek() (byte, error) {
	left := d.r.Len()
	if left == 0 {
		return 0, io.EOF
	}
	return d.src[len(d.src)-left], nil
}

// int reads any msgpack integer that fits in an int64.
func (d *recordDecoder) int() (int64, error) {
	c, err := d.peek()
	switch {
	case err != nil:
		return 0, err
	case c == msgpcode.Nil: // DecodeInt64 would read nil as 0
		return 0, errors.New("want an integer, got nil")
	case c == msgpcode.Uint64: // DecodeInt64 would wrap it
		v, err := d.dec.DecodeUint64()
		if err == nil && v > math.MaxInt64 {
			err = fmt.Errorf("integer %d overflows int64", v)
		}
		return int64(v), err
	}
	return d.dec.DecodeInt64()
}

// uint reads a non-negative integer no larger than max.
func (d *recordDecoder) uint(max uint64) (uint64, error) {
	v, err := d.int()
	if err == nil && (v < 0 || uint64(v) > max) {
		return 0, fmt.Errorf("integer %d out of range [0, %d]", v, max)
	}
	return uint64(v), err
}

// nilValue consumes a nil and reports whether there was one.
func (d *recordDecoder) nilValue() (bool, error) {
	c, err := d.peek()
	if err != nil || c != msgpcode.Nil {
		return false, err
	}
	return true, d.dec.DecodeNil()
}

func (d *recordDecoder) str() (string, error) {
	c, err := d.peek()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("want a string, got code 0x%02x", c)
	}
	p, err := d.raw()
	return string(p), err
}

// bin reads binary data (or nil) into a new slice; nil for length 0.
func (d *recordDecoder) bin() ([]byte, error) {
	if isNil, err := d.nilValue(); isNil || err != nil {
		return nil, err
	}
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	if !msgpcode.IsBin(c) {
		return nil, fmt.Errorf("want binary data, got code 0x%02x", c)
	}
	p, err := d.raw()
	if len(p) == 0 || err != nil {
		return nil, err
	}
	return append([]byte(nil), p...), nil
}

// raw reads a str or bin header with the library and returns the content as
// a sub-slice of src, after checking the length against the bytes left.
func (d *recordDecoder) raw() ([]byte, error) {
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	return d.take(n)
}

// take returns the next n bytes of src and moves past them.
func (d *recordDecoder) take(n int) ([]byte, error) {
	left := d.r.Len()
	if n < 0 || n > left { // n < 0: a 32-bit length that overflowed int
		return nil, fmt.Errorf("%d bytes declared, %d left", declared(n), left)
	}
	pos := len(d.src) - left
	if _, err := d.r.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, err
	}
	return d.src[pos : pos+n : pos+n], nil
}

// arrayLen reads an array header; a nil is refused.
func (d *recordDecoder) arrayLen() (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil { // DecodeArrayLen would say -1
		return 0, errors.New("want an array, got nil")
	}
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	return n, d.fits(n)
}

// fits checks that n values can be in the bytes left (each takes at least
// one), so a corrupt count fails at once instead of after n reads.
func (d *recordDecoder) fits(n int) error {
	if left := d.r.Len(); n < 0 || n > left {
		return fmt.Errorf("%d values declared in %d bytes", declared(n), left)
	}
	return nil
}

// declared is a msgpack length or count as it was stored: the library
// returns a 32-bit one as an int, which wraps below 0 on 32-bit platforms.
func declared(n int) uint64 {
	if n < 0 {
		return uint64(uint32(n))
	}
	return uint64(n)
}

// skip consumes one value of any type. Containers, strings, binary data and
// extensions are walked here, with their lengths checked; the library skips
// the fixed-size rest.
func (d *recordDecoder) skip(depth int) error {
	if depth > maxSkipDepth {
		return fmt.Errorf("values nested deeper than %d", maxSkipDepth)
	}
	c, err := d.peek()
	if err != nil {
		return err
	}
	var n int // values inside a container
	switch {
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		_, err = d.raw()
		return err
	case msgpcode.IsExt(c):
		_, size, err := d.dec.DecodeExtHeader()
		if err == nil {
			_, err = d.take(size)
		}
		return err
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err = d.arrayLen()
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		if n, err = d.dec.DecodeMapLen(); err == nil && n > math.MaxInt/2 {
			err = fmt.Errorf("map of %d entries", n)
		}
		n *= 2
		if err == nil {
			err = d.fits(n)
		}
	default:
		return d.dec.Skip()
	}
	for i := 0; i < n && err == nil; i++ {
		err = d.skip(depth + 1)
	}
	return err
}
