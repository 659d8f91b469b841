package logstore

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// syncRecorder replaces syncFile for a test and keeps what was synced.
type syncRecorder struct {
	mu     sync.Mutex
	synced []string         // file names, in order
	onSync func(f *os.File) // called before each sync, if set
}

func recordSyncs(t *testing.T) *syncRecorder {
	t.Helper()
	r := &syncRecorder{}
	prev := syncFile
	syncFile = func(f *os.File) error {
		r.mu.Lock()
		r.synced = append(r.synced, filepath.Base(f.Name()))
		on := r.onSync
		r.mu.Unlock()
		if on != nil {
			on(f)
		}
		return prev(f)
	}
	t.Cleanup(func() { syncFile = prev })
	return r
}

func (r *syncRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.synced
	r.synced = nil
	return s
}

// logFileNames lists dir's files with extension ext, sorted.
func logFileNames(t *testing.T, dir, ext string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+ext))
	if err != nil {
		t.Fatal(err)
	}
	for i := range m {
		m[i] = filepath.Base(m[i])
	}
	slices.Sort(m)
	return m
}

// appendPayloads appends n records of 128-byte payloads in groups of 1000.
func appendPayloads(t *testing.T, s *Stream, n int, ts int64) {
	t.Helper()
	payload := make([]byte, 128)
	for i := 0; i < n; i += 1000 {
		recs := make([]*Record, min(1000, n-i))
		for j := range recs {
			recs[j] = &Record{Topic: "sensors/x", Payload: payload, QoS: 1, Timestamp: ts}
		}
		if _, err := s.Append(context.Background(), recs...); err != nil {
			t.Fatal(err)
		}
	}
}

// waitSynced waits until the store's periodic sync has synced every one of
// names, and returns the files synced meanwhile, in order.
func waitSynced(t *testing.T, rec *syncRecorder, names []string) []string {
	t.Helper()
	var synced []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		synced = append(synced, rec.take()...)
		if !slices.ContainsFunc(names, func(n string) bool { return !slices.Contains(synced, n) }) {
			return synced
		}
	}
	t.Fatalf("after 5 s the periodic sync had synced %v, want all of %v", synced, names)
	return nil
}

// With interval durability the periodic sync reaches every log file written
// to since the last sync, not only the newest: here value-log files, which
// 1 MiB files make Badger move past quickly. (Badger syncs a value-log file
// when it moves past it, a memtable log it does not; but in a test a
// memtable Badger moves past is flushed and its log deleted within
// moments, too soon to check.) Badger's DB.Sync would sync only the
// newest file.
func TestLogSync_CoversFilesBadgerMovedPast(t *testing.T) {
	rec := recordSyncs(t)
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Durability: DurabilityInterval, SyncInterval: 20 * time.Millisecond})
	cfg.tune = func(p *profileSpec) { p.valueLogFileSize = 1 * mib }
	st := openStore(t, cfg)
	s := st.Stream("s")

	appendPayloads(t, s, 1000, 0)
	before := logFileNames(t, cfg.Dir, ".vlog")
	waitSynced(t, rec, before[len(before)-1:])

	appendPayloads(t, s, 20_000, 0) // about 4 MiB of values: Badger moves on to new files
	after := logFileNames(t, cfg.Dir, ".vlog")
	if after[len(after)-1] == before[len(before)-1] {
		t.Fatalf("value-log files %v after 20,000 records: none added, the test cannot tell", after)
	}
	// Every file from the one newest at the last sync on was written to.
	written := slices.DeleteFunc(after, func(n string) bool { return n < before[len(before)-1] })
	waitSynced(t, rec, written)
}

// Value-log GC copies what is live in a file to the head of the log, then
// Badger deletes the file. Without SyncWrites the copies must be synced
// before the file goes, or a power cut in between loses retained records.
func TestLogSync_ValueLogGCSyncsCopiesBeforeTheFileGoes(t *testing.T) {
	rec := recordSyncs(t)
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxAge: time.Hour, Durability: DurabilityInterval, SyncInterval: time.Hour})
	cfg.ReclaimInterval = time.Nanosecond
	cfg.tune = func(p *profileSpec) { p.valueLogFileSize = 1 * mib }
	st := openStore(t, cfg)
	s := st.Stream("s")
	old := time.Now().Add(-48 * time.Hour).UnixMilli()
	appendPayloads(t, s, 2*blockSize, old)               // two blocks retention drops whole
	appendPayloads(t, s, 20_000, time.Now().UnixMilli()) // kept, and some of it shares a file with the old
	vlogs := logFileNames(t, cfg.Dir, ".vlog")

	var mu sync.Mutex
	var seen [][]string // the value-log files present at each sync during GC
	rec.onSync = func(*os.File) {
		names := logFileNames(t, cfg.Dir, ".vlog")
		mu.Lock()
		seen = append(seen, names)
		mu.Unlock()
	}
	if _, err := s.ApplyRetention(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if s.FirstOffset() != 2*blockSize {
		t.Fatalf("FirstOffset = %d after retention, want %d", s.FirstOffset(), 2*blockSize)
	}
	st.valueLogGC(context.Background())
	rec.onSync = nil
	gone := slices.DeleteFunc(slices.Clone(vlogs), func(n string) bool {
		return slices.Contains(logFileNames(t, cfg.Dir, ".vlog"), n)
	})
	if len(gone) == 0 {
		t.Fatalf("value-log GC deleted none of %v: the test cannot tell", vlogs)
	}
	synced := rec.take()
	if len(seen) == 0 {
		t.Fatalf("value-log GC deleted %v with no sync", gone)
	}
	// A round deletes one file, after the sync that ends it: every file
	// gone was there at some sync.
	for _, name := range gone {
		if !slices.ContainsFunc(seen, func(files []string) bool { return slices.Contains(files, name) }) {
			t.Errorf("value-log file %s was deleted before a sync of its copies (synced: %v)", name, synced)
		}
	}
	if got := readAll(t, s, s.FirstOffset()); uint64(len(got)) != s.NextOffset()-s.FirstOffset() {
		t.Fatalf("read %d records of [%d, %d) after GC", len(got), s.FirstOffset(), s.NextOffset())
	}
}
