package logstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// metaHW keys a stream's persisted high watermark: 'x' 'h' <id:4> ->
// uint64 (BE). Only a store with ManualCommit writes it.
const metaHW = 'h'

func hwKey(id uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{tagMeta, metaHW}, id)
}

// SetHighWatermark moves the high watermark (Committed) up to hw, capped
// at the log end: for a leader the lowest log end across the ISR, for a
// follower the leader's high watermark (capped at its own log end). It
// never moves it down (Truncate below it is refused, ResetTo moves it).
// It only acts with Config.ManualCommit; without, the watermark follows
// the durable log end.
//
// The new watermark is published at once, without a write: every record
// below it is already durable (on this node's disk and, for a leader, on
// every ISR member's), which is all an acknowledgement promises. It is
// persisted lazily, at most hwPersistDelay later, in a transaction of its
// own that every move meanwhile shares (and on Close, and by
// SyncHighWatermark). A transaction and fsync per move would sit in every
// acks=all acknowledgement's path, twice (on the leader and on each
// follower), and split the group commits around it. So after a crash the
// store may open with a watermark below the one readers last saw, never
// above it: Read waits at such an offset (it is not out of range) until
// the watermark passes it again, which it does as soon as the replicas
// speak, since those records are committed on the ISR.
func (s *Stream) SetHighWatermark(ctx context.Context, hw uint64) error {
	if !s.st.cfg.ManualCommit {
		return nil
	}
	if s.isClosed() {
		return fmt.Errorf("set high watermark of %s to %d: %w", s.name, hw, s.closedErr())
	}
	s.hwMu.Lock()
	hw = min(hw, s.NextOffset()) // not remembered past the log end: a later append needs a new call
	moved := hw > s.committed.Load()
	if moved {
		s.committed.Store(hw)
	}
	s.hwMu.Unlock()
	if !moved {
		return nil
	}
	s.notify(movedHW)
	if s.hwDue.CompareAndSwap(false, true) {
		time.AfterFunc(hwPersistDelay, func() {
			if !s.enqueue(&request{kind: reqHW}) {
				s.hwDue.Store(false) // stopped: shutdown persists it
			}
		})
	}
	return nil
}

// hwPersistDelay bounds how far the persisted high watermark trails the
// published one: after a crash, readers wait at most about this long's
// worth of commits for the watermark to come back.
const hwPersistDelay = 200 * time.Millisecond

// SyncHighWatermark persists the published high watermark now and returns
// once it is durable; nothing to do without ManualCommit.
func (s *Stream) SyncHighWatermark(ctx context.Context) error {
	if !s.st.cfg.ManualCommit {
		return nil
	}
	if _, err := s.control(ctx, &request{kind: reqHW}); err != nil {
		return fmt.Errorf("sync high watermark of %s: %w", s.name, err)
	}
	return nil
}

// persistHW writes the published watermark when it is above the one last
// written (appender goroutine).
func (s *Stream) persistHW() error {
	s.hwDue.Store(false) // a move from now on schedules another write
	hw := s.committed.Load()
	if hw <= s.hwPersisted {
		return nil
	}
	err := s.update(func(txn *badger.Txn) error {
		return txn.Set(hwKey(s.id), binary.BigEndian.AppendUint64(nil, hw))
	})
	if err != nil {
		return fmt.Errorf("persist high watermark %d: %w", hw, err)
	}
	s.hwPersisted = hw
	return nil
}

// logHWError logs a failed lazy write of the watermark: the next move
// schedules another, and until one succeeds a crash reopens lower.
func (s *Stream) logHWError(err error) {
	if err != nil {
		s.st.log.Warn("logstore: persist high watermark", slog.String("stream", s.name), slog.Any("err", err))
	}
}

// loadHW returns the persisted high watermark, or start when none is
// persisted, clamped to [start, next] (Open).
func (s *Stream) loadHW(start, next uint64) (uint64, error) {
	hw := start
	err := s.st.view(func(txn *badger.Txn) error {
		item, err := txn.Get(hwKey(s.id))
		if err == badger.ErrKeyNotFound {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("%d bytes, want 8", len(v))
			}
			hw = binary.BigEndian.Uint64(v)
			return nil
		})
	})
	if err != nil {
		return 0, fmt.Errorf("read high watermark: %w", err)
	}
	return min(max(hw, start), next), nil
}

// ResetTo drops every record and starts the log at offset: NextOffset,
// FirstOffset and Committed all become offset. It is for a follower whose
// log end the leader no longer holds (retention there went past it), which
// must start over at the leader's log start. offset must be at least
// NextOffset (ErrOffsetOutOfRange otherwise), so no offset is ever given
// to two records; the leader-epoch cache is emptied (its epochs describe
// records that are gone), and the records' space comes back as retention's
// does, with a later reclaim. It goes through the appender, ordered with
// appends.
func (s *Stream) ResetTo(ctx context.Context, offset uint64) error {
	if _, err := s.control(ctx, &request{kind: reqReset, offset: offset}); err != nil {
		return fmt.Errorf("reset %s to %d: %w", s.name, offset, err)
	}
	return nil
}

// reset is ResetTo on the appender goroutine. The new log start (and
// watermark) and the emptied epoch cache are one transaction: Open then
// finds no record at or above the start, and a log end equal to it.
func (s *Stream) reset(offset uint64) error {
	if next := s.next.Load(); offset < next {
		return fmt.Errorf("offset below the log end %d: %w", next, ErrOffsetOutOfRange)
	}
	epochs := s.epochs.reset()
	err := s.update(func(txn *badger.Txn) error {
		if err := txn.Set(startKey(s.id), binary.BigEndian.AppendUint64(nil, offset)); err != nil {
			return err
		}
		if s.st.cfg.ManualCommit {
			if err := txn.Set(hwKey(s.id), binary.BigEndian.AppendUint64(nil, offset)); err != nil {
				return err
			}
		}
		return deleteEpochs(txn, s.id, epochs)
	})
	if err != nil {
		s.epochs.add(epochs)
		return fmt.Errorf("persist log start %d: %w", offset, err)
	}
	s.tail.truncate(0)
	s.mu.Lock()
	s.mu.chunks = nil
	s.mu.Unlock()
	s.reclaim.hidden += s.bytes.Swap(0)
	s.first.Store(offset)
	s.next.Store(offset)
	s.shipResetTo(offset)
	s.hwMu.Lock()
	s.committed.Store(offset)
	s.hwMu.Unlock()
	s.hwPersisted = offset
	s.notify(movedHW | movedEnd)
	return s.maybeReclaim(time.Now())
}
