package logstore

import (
	"context"
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
