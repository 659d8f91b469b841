package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// MaxFrame bounds a frame's length (kind and body): a fetch answers with
// at most a few MiB of records, and a peer cannot make us allocate more.
const MaxFrame = 64 << 20

// ErrFrameTooLarge is returned for a frame longer than MaxFrame.
var ErrFrameTooLarge = errors.New("wire: frame too large")

// WriteFrame writes one frame of kind and body.
func WriteFrame(w io.Writer, kind byte, body []byte) error {
	if len(body)+1 > MaxFrame {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(body)+1)
	}
	hdr := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(hdr, uint32(len(body)+1))
	hdr[4] = kind
	_, err := w.Write(append(hdr, body...))
	return err
}

// ReadFrame reads one frame; buf is reused for its body when large enough.
func ReadFrame(r io.Reader, buf []byte) (kind byte, body []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n == 0 {
		return 0, nil, errors.New("wire: empty frame")
	}
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	if cap(buf) < int(n-1) {
		buf = make([]byte, n-1)
	}
	body = buf[:n-1]
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, fmt.Errorf("wire: frame body: %w", noEOF(err))
	}
	return hdr[4], body, nil
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
