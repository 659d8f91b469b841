package logstore

import (
	"context"
	"encoding/binary"
	"fmt"
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
// The new watermark is persisted before readers see it: SetHighWatermark
// goes through the appender, writes it in a transaction of its own, then
// publishes it and returns. So after a crash the store opens with the last
// watermark it showed, never a lower one: a consumer that read a record
// never finds it uncommitted again (Read would refuse its next offset as
// out of range). It may be ahead of what the cluster would derive, which
// never goes below an HW it already gave out. As durable as an append:
// under interval durability a power cut may lose up to SyncInterval of
// it, as of the records. Calls that pile up are written once: each
// persists the highest asked for so far (capped at the log end when
// asked).
func (s *Stream) SetHighWatermark(ctx context.Context, hw uint64) error {
	if !s.st.cfg.ManualCommit {
		return nil
	}
	hw = min(hw, s.NextOffset()) // not remembered past the log end: a later append needs a new call
	for {
		cur := s.hwWant.Load()
		if hw <= cur || s.hwWant.CompareAndSwap(cur, hw) {
			break
		}
	}
	if hw <= s.Committed() {
		return nil
	}
	if _, err := s.control(ctx, &request{kind: reqHW}); err != nil {
		return fmt.Errorf("set high watermark of %s to %d: %w", s.name, hw, err)
	}
	return nil
}

// persistHW writes and then publishes the highest watermark asked for,
// capped at the log end (appender goroutine).
func (s *Stream) persistHW() error {
	hw := min(s.hwWant.Load(), s.next.Load())
	if hw <= s.committed.Load() {
		return nil
	}
	err := s.update(func(txn *badger.Txn) error {
		return txn.Set(hwKey(s.id), binary.BigEndian.AppendUint64(nil, hw))
	})
	if err != nil {
		return fmt.Errorf("persist high watermark %d: %w", hw, err)
	}
	s.committed.Store(hw)
	s.notify(movedHW)
	return nil
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
	s.committed.Store(offset)
	s.hwWant.Store(offset)
	s.notify(movedHW | movedEnd)
	return s.maybeReclaim(time.Now())
}
