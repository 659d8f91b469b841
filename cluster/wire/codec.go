package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// encoder appends msgpack to a byte slice; it cannot fail.
type encoder struct {
	w   appendWriter
	enc *msgpack.Encoder
}

type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }
func (w *appendWriter) WriteByte(c byte) error      { w.b = append(w.b, c); return nil }

func newEncoder(dst []byte) *encoder {
	e := &encoder{w: appendWriter{dst}}
	e.enc = msgpack.NewEncoder(&e.w)
	return e
}

// The library's encoder only fails when its writer does; appendWriter never.
func (e *encoder) array(n int)   { _ = e.enc.EncodeArrayLen(n) }
func (e *encoder) uint(v uint64) { _ = e.enc.EncodeUint(v) }
func (e *encoder) str(s string)  { _ = e.enc.EncodeString(s) }
func (e *encoder) bin(p []byte)  { _ = e.enc.EncodeBytesLen(len(p)); e.w.b = append(e.w.b, p...) }
func (e *encoder) bytes() []byte { return e.w.b }

// decoder reads msgpack from src, checking every declared length against
// the bytes left before it allocates or slices.
type decoder struct {
	src []byte
	r   bytes.Reader
	dec *msgpack.Decoder
}

func newDecoder(src []byte) *decoder {
	d := &decoder{src: src}
	d.r.Reset(src)
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}

var errShort = errors.New("wire: message ends early")

func (d *decoder) wrap(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errShort
	}
	return fmt.Errorf("wire: %w", err)
}

// array reads an array header that must hold exactly n fields.
func (d *decoder) array(n int) error {
	if c, err := d.dec.PeekCode(); err != nil {
		return d.wrap(err)
	} else if c == msgpcode.Nil {
		return errors.New("wire: want an array, got nil")
	}
	got, err := d.dec.DecodeArrayLen()
	if err != nil {
		return d.wrap(err)
	}
	if got != n {
		return fmt.Errorf("wire: %d fields, want %d", got, n)
	}
	return nil
}

// arrayOf reads an array header of lo to hi fields: a message that grew
// a trailing field keeps its older, shorter form decodable.
func (d *decoder) arrayOf(lo, hi int) (int, error) {
	if c, err := d.dec.PeekCode(); err != nil {
		return 0, d.wrap(err)
	} else if c == msgpcode.Nil {
		return 0, errors.New("wire: want an array, got nil")
	}
	got, err := d.dec.DecodeArrayLen()
	if err != nil {
		return 0, d.wrap(err)
	}
	if got < lo || got > hi {
		return 0, fmt.Errorf("wire: %d fields, want %d to %d", got, lo, hi)
	}
	return got, nil
}

// count reads an array header and checks the count fits in the bytes left.
func (d *decoder) count() (int, error) {
	if c, err := d.dec.PeekCode(); err != nil {
		return 0, d.wrap(err)
	} else if c == msgpcode.Nil {
		return 0, errors.New("wire: want an array, got nil")
	}
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return 0, d.wrap(err)
	}
	if n < 0 || n > d.r.Len() {
		return 0, fmt.Errorf("wire: %d values declared in %d bytes", n, d.r.Len())
	}
	return n, nil
}

func (d *decoder) uint(max uint64) (uint64, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, d.wrap(err)
	}
	switch {
	case c <= msgpcode.PosFixedNumHigh, c == msgpcode.Uint8, c == msgpcode.Uint16, c == msgpcode.Uint32, c == msgpcode.Uint64:
	default:
		return 0, fmt.Errorf("wire: want an unsigned integer, got code 0x%02x", c)
	}
	v, err := d.dec.DecodeUint64()
	if err != nil {
		return 0, d.wrap(err)
	}
	if v > max {
		return 0, fmt.Errorf("wire: %d is above %d", v, max)
	}
	return v, nil
}

// raw reads a str or bin as a sub-slice of src.
func (d *decoder) raw(str bool) ([]byte, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return nil, d.wrap(err)
	}
	if str && !msgpcode.IsString(c) || !str && !msgpcode.IsBin(c) {
		return nil, fmt.Errorf("wire: unexpected code 0x%02x", c)
	}
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return nil, d.wrap(err)
	}
	left := d.r.Len()
	if n < 0 || n > left {
		return nil, fmt.Errorf("wire: %d bytes declared, %d left", n, left)
	}
	pos := len(d.src) - left
	if _, err := d.r.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, err
	}
	return d.src[pos : pos+n : pos+n], nil
}

func (d *decoder) str() (string, error) {
	p, err := d.raw(true)
	return string(p), err
}

// end checks nothing follows the message.
func (d *decoder) end() error {
	if d.r.Len() != 0 {
		return fmt.Errorf("wire: %d bytes after the message", d.r.Len())
	}
	return nil
}
