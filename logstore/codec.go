package logstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// Key prefixes (see doc.go for the layout). Records sort before every
// other key, so the keys a commit rewrites (chunk stats, log start,
// consumer state) sit after the log's newest records, not in front of the
// whole log (layout.go says why).
const (
	tagRecord = 'r'
	tagChunk  = 's'
	tagState  = 't' // consumer state: t <key> -> value (state.go)
	tagMeta   = 'x'

	metaStreamID = 'n' // x n <name>       -> stream id (uint32 BE)
	metaStart    = 's' // x s <id>         -> log start (uint64 BE)
	metaLayout   = 'v' // x v              -> key layout version (uint32 BE)

	recordKeyLen = 1 + 4 + 8
	blockKeyLen  = 1 + 4 + 6 // the part of a record key that names its block
	valueVersion = 1
	valueHeader  = 1 + 4 // version, crc32c

	chunkShift  = 10 // 1024 offsets per chunk of stats
	chunkSize   = 1 << chunkShift
	blockShift  = 16 // 65536 offsets per DropPrefix block (6-byte key prefix)
	blockSize   = 1 << blockShift
	chunkValLen = 4 + 8 + 8 + 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func streamIDKey(name string) []byte { return append([]byte{tagMeta, metaStreamID}, name...) }

func startKey(id uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{tagMeta, metaStart}, id)
}

// prefix returns tag + stream id.
func prefix(tag byte, id uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{tag}, id)
}

func recordKey(id uint32, off uint64) []byte {
	return binary.BigEndian.AppendUint64(prefix(tagRecord, id), off)
}

func chunkKey(id uint32, chunkStart uint64) []byte {
	return binary.BigEndian.AppendUint64(prefix(tagChunk, id), chunkStart)
}

// blockPrefix is the key prefix shared by every key of tag for stream id in
// the 65536-offset block that starts at block<<16.
func blockPrefix(tag byte, id uint32, block uint64) []byte {
	var off [8]byte
	binary.BigEndian.PutUint64(off[:], block<<blockShift)
	return append(prefix(tag, id), off[:6]...)
}

// keyOffset reads the offset of a record or chunk key.
func keyOffset(k []byte) uint64 { return binary.BigEndian.Uint64(k[len(k)-8:]) }

// chunk holds the stats of the records of one 1024-offset chunk that are
// at or above the log start.
type chunk struct {
	start        uint64 // first offset of the chunk (multiple of 1024)
	count        uint32
	bytes        int64
	minTs, maxTs int64 // unix ms
}

func (c chunk) encode() []byte {
	b := make([]byte, 0, chunkValLen)
	b = binary.BigEndian.AppendUint32(b, c.count)
	b = binary.BigEndian.AppendUint64(b, uint64(c.bytes))
	b = binary.BigEndian.AppendUint64(b, uint64(c.minTs))
	return binary.BigEndian.AppendUint64(b, uint64(c.maxTs))
}

func decodeChunk(start uint64, b []byte) (chunk, error) {
	if len(b) != chunkValLen {
		return chunk{}, fmt.Errorf("chunk stats at %d: %d bytes, want %d", start, len(b), chunkValLen)
	}
	return chunk{
		start: start,
		count: binary.BigEndian.Uint32(b),
		bytes: int64(binary.BigEndian.Uint64(b[4:])),
		minTs: int64(binary.BigEndian.Uint64(b[12:])),
		maxTs: int64(binary.BigEndian.Uint64(b[20:])),
	}, nil
}

func (c *chunk) add(ts int64, size int64) {
	if c.count == 0 || ts < c.minTs {
		c.minTs = ts
	}
	if c.count == 0 || ts > c.maxTs {
		c.maxTs = ts
	}
	c.count++
	c.bytes += size
}

// Record value fields, in msgpack array order. Trailing empty fields are
// left out; a decoder skips fields it does not know.
const (
	fTimestamp = iota
	fTopic
	fPayload
	fFlags // qos | retain<<2
	fClientID
	fEpoch
	fContentType
	fPayloadFormat // nil when unset
	fResponseTopic
	fCorrelationData
	fUserProperties // flat array k0, v0, k1, v1, ...
	fMessageExpiry  // seconds from the timestamp; 0 or absent: never
	numFields
)

// encodeRecord appends the stored value of r (header + msgpack body) to dst.
// The CRC covers the offset, so a value copied under another key is caught.
func encodeRecord(dst []byte, r *Record) []byte {
	n := numFields
	for n > fFlags+1 && fieldEmpty(r, n-1) {
		n--
	}
	base := len(dst)
	dst = append(dst, valueVersion, 0, 0, 0, 0)
	dst = appendBody(dst, r, n)
	binary.BigEndian.PutUint32(dst[base+1:], valueCRC(r.Offset, dst[base:base+1], dst[base+valueHeader:]))
	return dst
}

func (e *recordEncoder) body(r *Record, n int) error {
	enc := e.enc
	if err := enc.EncodeArrayLen(n); err != nil {
		return err
	}
	for i := range n {
		var err error
		switch i {
		case fTimestamp:
			err = e.int(r.Timestamp)
		case fTopic:
			err = enc.EncodeString(r.Topic)
		case fPayload:
			err = e.bin(r.Payload)
		case fFlags:
			f := uint64(r.QoS & 3)
			if r.Retain {
				f |= 4
			}
			err = enc.EncodeUint(f)
		case fClientID:
			err = enc.EncodeString(r.ClientID)
		case fEpoch:
			err = enc.EncodeUint(uint64(r.Epoch))
		case fContentType:
			err = enc.EncodeString(r.ContentType)
		case fPayloadFormat:
			if r.PayloadFormat == nil {
				err = enc.EncodeNil()
			} else {
				err = enc.EncodeUint(uint64(*r.PayloadFormat))
			}
		case fResponseTopic:
			err = enc.EncodeString(r.ResponseTopic)
		case fCorrelationData:
			err = e.bin(r.CorrelationData)
		case fUserProperties:
			err = enc.EncodeArrayLen(2 * len(r.UserProperties))
			for _, p := range r.UserProperties {
				if err == nil {
					err = enc.EncodeString(p.Key)
				}
				if err == nil {
					err = enc.EncodeString(p.Value)
				}
			}
		case fMessageExpiry:
			err = enc.EncodeUint(uint64(r.MessageExpiry))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// valueCRC is the CRC-32C of off (8 bytes, big-endian), version and body.
func valueCRC(off uint64, version, body []byte) uint32 {
	// The offset goes through the table a byte at a time: a stack array
	// handed to crc32.Update escapes, one allocation per record written or
	// read.
	c := ^uint32(0)
	for shift := 56; shift >= 0; shift -= 8 {
		c = castagnoli[byte(c)^byte(off>>shift)] ^ c>>8
	}
	c = crc32.Update(^c, castagnoli, version)
	return crc32.Update(c, castagnoli, body)
}

func fieldEmpty(r *Record, f int) bool {
	switch f {
	case fClientID:
		return r.ClientID == ""
	case fEpoch:
		return r.Epoch == 0
	case fContentType:
		return r.ContentType == ""
	case fPayloadFormat:
		return r.PayloadFormat == nil
	case fResponseTopic:
		return r.ResponseTopic == ""
	case fCorrelationData:
		return len(r.CorrelationData) == 0
	case fUserProperties:
		return len(r.UserProperties) == 0
	case fMessageExpiry:
		return r.MessageExpiry == 0
	}
	return false
}

var (
	errShortValue = errors.New("value shorter than its header")
	errVersion    = errors.New("unknown value format version")
	errChecksum   = errors.New("checksum mismatch")
)

// decodeRecord decodes the value stored at offset off into a new Record.
// It never panics and never allocates more than len(v) for the payload.
func decodeRecord(off uint64, v []byte) (*Record, error) {
	if len(v) < valueHeader {
		return nil, errShortValue
	}
	if v[0] != valueVersion {
		return nil, fmt.Errorf("%w %d", errVersion, v[0])
	}
	if want, got := binary.BigEndian.Uint32(v[1:]), valueCRC(off, v[:1], v[valueHeader:]); want != got {
		return nil, fmt.Errorf("%w: stored %08x, computed %08x", errChecksum, want, got)
	}
	r := &Record{Offset: off}
	if err := decodeBody(r, v[valueHeader:]); err != nil {
		return nil, err
	}
	return r, nil
}

var fieldNames = [numFields]string{"timestamp", "topic", "payload", "flags", "client id", "epoch",
	"content type", "payload format", "response topic", "correlation data", "user properties",
	"message expiry"}

func (d *recordDecoder) record(r *Record) error {
	n, err := d.arrayLen()
	if err != nil {
		return fmt.Errorf("record: %w", eof(err))
	}
	if n < fFlags+1 {
		return fmt.Errorf("record has %d fields, want at least %d", n, fFlags+1)
	}
	for i := range n {
		if err := d.field(r, i); err != nil {
			name := "unknown"
			if i < numFields {
				name = fieldNames[i]
			}
			return fmt.Errorf("record field %d (%s): %w", i, name, eof(err))
		}
	}
	if left := d.r.Len(); left != 0 {
		return fmt.Errorf("%d trailing bytes after the record", left)
	}
	return nil
}

func (d *recordDecoder) field(r *Record, i int) (err error) {
	var u uint64
	switch i {
	case fTimestamp:
		r.Timestamp, err = d.int()
	case fTopic:
		r.Topic, err = d.str()
	case fPayload:
		r.Payload, err = d.bin()
	case fFlags:
		u, err = d.uint(0xff)
		r.QoS, r.Retain = byte(u&3), u&4 != 0
	case fClientID:
		r.ClientID, err = d.str()
	case fEpoch:
		u, err = d.uint(math.MaxUint32)
		r.Epoch = uint32(u)
	case fContentType:
		r.ContentType, err = d.str()
	case fPayloadFormat:
		var isNil bool
		if isNil, err = d.nilValue(); err == nil && !isNil {
			u, err = d.uint(0xff)
			pf := byte(u)
			r.PayloadFormat = &pf
		}
	case fResponseTopic:
		r.ResponseTopic, err = d.str()
	case fCorrelationData:
		r.CorrelationData, err = d.bin()
	case fUserProperties:
		r.UserProperties, err = d.userProperties()
	case fMessageExpiry:
		u, err = d.uint(math.MaxUint32)
		r.MessageExpiry = uint32(u)
	default: // a field added by a newer writer
		err = d.skip(0)
	}
	return err
}

// userProperties reads the flat [k0, v0, k1, v1, ...] array (or nil).
func (d *recordDecoder) userProperties() ([]UserProperty, error) {
	if isNil, err := d.nilValue(); isNil || err != nil {
		return nil, err
	}
	m, err := d.arrayLen()
	if err != nil || m == 0 {
		return nil, err
	}
	if m%2 != 0 {
		return nil, errors.New("odd number of strings")
	}
	props := make([]UserProperty, 0, min(m/2, 64))
	for range m / 2 {
		k, err := d.str()
		if err != nil {
			return nil, err
		}
		v, err := d.str()
		if err != nil {
			return nil, err
		}
		props = append(props, UserProperty{Key: k, Value: v})
	}
	return props, nil
}
