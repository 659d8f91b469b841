package logstore

import "sync"

// Tail cache bounds: the most recently written records kept in memory.
const (
	tailRecords = 2048    // a power of two
	tailBytes   = 2 << 20 // by Record.Size
)

// tail keeps the most recently written records of a stream in memory, so a
// reader at the log's end (the live subscribers' shared reader, later the
// replicas) is served without a Badger read and a decode. The appender adds
// each committed transaction's records; truncation drops what it removes.
// Records are shared, never copied: Record's contract forbids changing one
// after Append.
type tail struct {
	mu    sync.RWMutex
	ring  [tailRecords]*Record
	start uint64 // offset of the oldest cached record
	end   uint64 // offset after the newest cached record
	bytes int
}

// add caches recs, the records at offsets first, first+1, ...; a gap from
// what is cached starts over.
func (t *tail) add(first uint64, recs []*Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if first != t.end {
		t.resetLocked(first)
	}
	for _, r := range recs {
		if t.end-t.start == tailRecords {
			t.evictLocked()
		}
		t.ring[t.end%tailRecords] = r
		t.end++
		t.bytes += r.Size()
	}
	for t.bytes > tailBytes && t.end-t.start > 1 {
		t.evictLocked()
	}
}

func (t *tail) evictLocked() {
	i := t.start % tailRecords
	t.bytes -= t.ring[i].Size()
	t.ring[i] = nil
	t.start++
}

func (t *tail) resetLocked(at uint64) {
	clear(t.ring[:])
	t.start, t.end, t.bytes = at, at, 0
}

// truncate forgets every cached record at or above offset.
func (t *tail) truncate(offset uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if offset < t.end {
		t.resetLocked(offset)
	}
}

// read returns the cached records from offset from, below hw, within the
// limits of Stream.Read; ok is false when from is not cached.
func (t *tail) read(from, hw uint64, max, maxBytes int) (recs []*Record, ok bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if from < t.start || from >= t.end {
		return nil, false
	}
	end := min(hw, t.end)
	if max > 0 && from+uint64(max) < end {
		end = from + uint64(max)
	}
	recs = make([]*Record, 0, end-from)
	size := 0
	for off := from; off < end; off++ {
		r := t.ring[off%tailRecords]
		size += r.Size()
		if maxBytes > 0 && size > maxBytes && len(recs) > 0 {
			break
		}
		recs = append(recs, r)
	}
	return recs, true
}
