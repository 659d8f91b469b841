package logstore

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Record batches (key layout 3, doc.go "Record value"): one Badger entry
// holds the records of a run of offsets, keyed by the last one.
const (
	batchVersion = 2 // value version of a batch of records

	// maxBatchValue caps a batch's encoded value. Badger's cost per entry
	// (a ~45-byte pointer entry in the write-ahead log, then in a level-0
	// table, then at every compaction) is 0.15% of 32 KiB, so larger
	// batches save nothing measurable on disk, while a read from the middle
	// of a batch walks its framing from the start, a reader holds a whole
	// batch to serve one record of it, and in-memory stores keep values
	// inline in their tables. Store.batchCap lowers it to MaxRecordBytes
	// (1 KiB in memory on 32-bit platforms). A record larger than the cap is
	// a batch of one.
	maxBatchValue = 32 * kib
)

var errBatchFraming = errors.New("bad batch framing")

// batchCap is the largest encoded batch the store writes.
func (st *Store) batchCap() int {
	if st.cfg.batchValue > 0 {
		return min(st.cfg.batchValue, st.maxValue)
	}
	return min(maxBatchValue, st.maxValue)
}

// parseBatch splits the value stored under the key of offset last into its
// records' values (version 1 each), appended to vals[:0], and returns the
// batch's first offset. A version-1 value is a batch of one. The framing is
// checked whole before anything is returned: a record count that does not
// fit the value, a batch that would cross a 1024-offset chunk, a length past
// the end or trailing bytes fail it. The records' own checksums are left to
// decodeRecord. It never panics, and vals grows by at most one element per
// 6 bytes of v.
func parseBatch(last uint64, v []byte, vals [][]byte) (first uint64, _ [][]byte, err error) {
	vals = vals[:0]
	if len(v) == 0 {
		return 0, vals, errShortValue
	}
	switch v[0] {
	case valueVersion:
		return last, append(vals, v), nil
	case batchVersion:
	default:
		return 0, vals, fmt.Errorf("%w %d", errVersion, v[0])
	}
	n, k := binary.Uvarint(v[1:])
	switch {
	case k <= 0:
		return 0, vals, fmt.Errorf("%w: unreadable record count", errBatchFraming)
	case n == 0 || n > chunkSize || n > last+1 || (last-(n-1))>>chunkShift != last>>chunkShift:
		return 0, vals, fmt.Errorf("%w: %d records ending at offset %d", errBatchFraming, n, last)
	case n > uint64(len(v))/(1+valueHeader): // each record: a length byte and a header at least
		return 0, vals, fmt.Errorf("%w: %d records in %d bytes", errBatchFraming, n, len(v))
	}
	p := v[1+k:]
	for i := range n {
		l, k := binary.Uvarint(p)
		if k <= 0 || l > uint64(len(p)-k) {
			return 0, vals[:0], fmt.Errorf("%w: record %d of %d runs past the value", errBatchFraming, i, n)
		}
		vals = append(vals, p[k:k+int(l)])
		p = p[k+int(l):]
	}
	if len(p) != 0 {
		return 0, vals[:0], fmt.Errorf("%w: %d trailing bytes", errBatchFraming, len(p))
	}
	return last - (n - 1), vals, nil
}

// batchLen is the encoded size of a batch of n (>= 2) records whose values
// take body bytes with their length prefixes.
func batchLen(n, body int) int { return 1 + uvarintLen(uint64(n)) + body }

// framedLen is what a record value of l bytes takes inside a batch.
func framedLen(l int) int { return uvarintLen(uint64(l)) + l }

// appendBatch appends the stored value of the records whose values are
// vals: a single value as it is, more as a version-2 batch.
func appendBatch(dst []byte, vals [][]byte) []byte {
	if len(vals) == 1 {
		return append(dst, vals[0]...)
	}
	dst = append(dst, batchVersion)
	dst = binary.AppendUvarint(dst, uint64(len(vals)))
	for _, v := range vals {
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	return dst
}

// recordBytes is what a record whose version-1 value takes l bytes counts
// in the chunk stats (Bytes), wherever it is stored: its own key and its
// value, what it took as its own entry in key layout 2. A batch of n >= 2
// takes 13(n-1) bytes of keys less and 2 to 3 bytes of framing per record
// more, so Bytes overstates the disk by about 10 bytes per batched record,
// never understates it, and retention by bytes keeps exactly the records it
// kept before batches.
func recordBytes(l int) int64 { return int64(recordKeyLen + l) }

func uvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}
