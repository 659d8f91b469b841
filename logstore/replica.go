package logstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"
)

// AppendReplica appends raw record values at the leader's offsets: vals[i]
// is the value the leader stores at base+i (ReadRaw returns them), and is
// stored unchanged, with the leader's timestamp and epoch. base must be
// NextOffset (ErrNotAtLogEnd otherwise: truncate, or fetch from the log
// end). Each value's checksum, which covers its offset, is verified before
// anything is written, so a value shipped for another offset, or damaged
// on the way, fails the whole call with a *CorruptError at its offset and
// nothing is appended. It goes through the appender, ordered with appends,
// truncation and retention, and returns once the values are durable. With
// more than one Badger transaction's worth, an error may come after a
// prefix was appended: NextOffset says how far.
//
// A replica append moves the high watermark as an append does: not at all
// with ManualCommit (SetHighWatermark does), to the log end without.
// vals may be reused once it returns.
func (s *Stream) AppendReplica(ctx context.Context, base uint64, vals [][]byte) error {
	if len(vals) == 0 {
		return nil
	}
	_, err := s.control(ctx, &request{kind: reqReplica, offset: base, vals: vals})
	if err != nil {
		return fmt.Errorf("replica append to %s at %d: %w", s.name, base, err)
	}
	return nil
}

// appendReplica is AppendReplica on the appender goroutine.
func (s *Stream) appendReplica(base uint64, vals [][]byte) (uint64, error) {
	if next := s.next.Load(); base != next {
		return 0, fmt.Errorf("log end is %d: %w", next, ErrNotAtLogEnd)
	}
	now := time.Now()
	s.lastCommit = now
	if err := s.st.space.check(now); err != nil {
		s.st.space.noted(s.st.log, err)
		s.st.metrics.AppendErrors.WithLabelValues(s.name, reasonNoSpace).Inc()
		s.retainForSpace(now)
		return 0, err
	}
	ents := make([]pending, len(vals))
	epoch, _ := s.epochs.latest()
	for i, v := range vals {
		off := base + uint64(i)
		if len(v) > s.st.maxValue {
			s.st.metrics.AppendErrors.WithLabelValues(s.name, reasonTooBig).Inc()
			return 0, fmt.Errorf("%w: %d bytes at offset %d, at most %d", ErrRecordTooLarge, len(v), off, s.st.maxValue)
		}
		rec, err := decodeRecord(off, v)
		if err != nil {
			s.st.metrics.AppendErrors.WithLabelValues(s.name, reasonInvalid).Inc()
			return 0, &CorruptError{Stream: s.name, Offset: off, Err: err}
		}
		if rec.Epoch < epoch.epoch {
			s.st.metrics.AppendErrors.WithLabelValues(s.name, reasonInvalid).Inc()
			return 0, fmt.Errorf("record %d of epoch %d after epoch %d: %w", off, rec.Epoch, epoch.epoch, ErrStaleEpoch)
		}
		epoch.epoch = rec.Epoch
		ents[i] = pending{key: recordKey(s.id, off), val: v, ts: rec.Timestamp, rec: rec}
	}
	s.st.metrics.BatchRecords.Observe(float64(len(ents)))
	for written := 0; written < len(ents); {
		n, err := s.writeRecords(base+uint64(written), ents[written:])
		written += n
		if err != nil {
			return uint64(written), s.appendError(err)
		}
	}
	s.retainOnCommit(now)
	return uint64(len(ents)), nil
}

// ReadRaw returns the stored values of the records from offset from on,
// up to the log end as followers see it (ShipEnd: NextOffset, not
// Committed, since a follower replicates what is not committed yet, plus
// a leader's group commit still being written, see ship.go), for a
// replica fetch: vals[i] is the value of from+i, as AppendReplica takes
// it. It returns at least one value when from < NextOffset (even if
// larger than maxBytes), at most max values (max <= 0: no limit) and at
// most maxBytes of values in total (maxBytes <= 0: no limit); none at
// ShipEnd, and an error wrapping ErrOffsetOutOfRange below FirstOffset or
// above ShipEnd. Each stored value's checksum is verified (not decoded): a
// damaged record ends the read as in Read, so a leader reports its own
// damage instead of shipping it.
//
// Raw values skip the decode and re-encode of Read: 1.05-1.37M records/s
// shipped against 0.24-0.54M (FACTS.md). They are read from Badger (the
// tail cache holds decoded records), and the ones being written from the
// group commit's own buffer.
func (s *Stream) ReadRaw(from uint64, max, maxBytes int) ([][]byte, error) {
	s.st.life.RLock()
	defer s.st.life.RUnlock()
	if s.st.life.closed {
		return nil, fmt.Errorf("raw read %s: %w", s.name, ErrClosed)
	}
	if s.removed.Load() {
		return nil, fmt.Errorf("raw read %s: %w", s.name, errRemoved)
	}
	end, start := s.NextOffset(), s.FirstOffset()
	shipEnd := s.ShipEnd()
	if from < start || from > shipEnd {
		return nil, fmt.Errorf("raw read %s at %d (log holds [%d, %d)): %w", s.name, from, start, shipEnd, ErrOffsetOutOfRange)
	}
	want := shipEnd - from
	if max > 0 && uint64(max) < want {
		want = uint64(max)
	}
	if from >= end { // all of it is being written (ship.go)
		if out := s.readShipped([][]byte{}, from, want, maxBytes); len(out) > 0 {
			return out, nil
		}
		if end = s.NextOffset(); from >= end { // or written by now, or cut
			return [][]byte{}, nil
		}
	}
	out, corrupt, err := s.readRaw(from, min(want, end-from), maxBytes)
	if err != nil {
		return nil, fmt.Errorf("raw read %s at %d: %w", s.name, from, err)
	}
	if corrupt == nil && uint64(len(out)) == end-from && uint64(len(out)) < want {
		out = s.readShipped(out, end, want, maxBytes)
	}
	if corrupt != nil && len(out) == 0 {
		if from < s.FirstOffset() || from >= s.NextOffset() { // retention or truncation moved meanwhile
			return nil, fmt.Errorf("raw read %s at %d: %w", s.name, from, ErrOffsetOutOfRange)
		}
		s.mCorrupt.Inc()
		return nil, &CorruptError{Stream: s.name, Offset: from, Err: corrupt}
	}
	return out, nil
}

// readRaw is readStored for ReadRaw: it copies the values it returns into
// one buffer and checks their checksums instead of decoding them.
func (s *Stream) readRaw(from, want uint64, maxBytes int) (out [][]byte, corrupt, err error) {
	out = make([][]byte, 0, min(want, 1024))
	var buf []byte
	corrupt, err = s.walkStored(from, func(off uint64, v []byte) (bool, error) {
		if err := checkValue(off, v); err != nil {
			return false, err
		}
		if maxBytes > 0 && len(buf)+len(v) > maxBytes && len(out) > 0 {
			return false, nil
		}
		if buf == nil { // size it from the first value: records of a stream are alike
			buf = make([]byte, 0, rawBufHint(len(v), want, maxBytes))
		}
		b0 := len(buf)
		buf = append(buf, v...) // a grown buf leaves earlier values in the old array, intact
		out = append(out, buf[b0:len(buf):len(buf)])
		return uint64(len(out)) < want, nil
	})
	return out, corrupt, err
}

// rawBufHint is the buffer ReadRaw starts with: want values the size of
// the first, within maxBytes, at most 4 MiB (append grows it past).
func rawBufHint(first int, want uint64, maxBytes int) int {
	n := uint64(first) * want
	if maxBytes > 0 {
		n = min(n, uint64(maxBytes))
	}
	return int(min(n+64, 4<<20))
}

// checkValue checks the header and checksum of the value stored at off,
// without decoding its body.
func checkValue(off uint64, v []byte) error {
	if len(v) < valueHeader {
		return errShortValue
	}
	if v[0] != valueVersion {
		return fmt.Errorf("%w %d", errVersion, v[0])
	}
	if want, got := binary.BigEndian.Uint32(v[1:]), valueCRC(off, v[:1], v[valueHeader:]); want != got {
		return fmt.Errorf("%w: stored %08x, computed %08x", errChecksum, want, got)
	}
	return nil
}

// EncodeValue is the stored value of r at r.Offset, as AppendReplica takes
// it: a mirror (edge/mirror) writes records at its source's offsets
// through AppendReplica, which appends only at the log end.
func EncodeValue(r *Record) []byte { return encodeRecord(nil, r) }
