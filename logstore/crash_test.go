package logstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// copyDir copies the files of src to a new directory, as a crash would
// leave them: the store is still open and was never closed.
func copyDir(tb testing.TB, src string) string {
	tb.Helper()
	dst := tb.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "LOCK" {
			continue
		}
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			tb.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			tb.Fatal(err)
		}
		in.Close()
		out.Close()
	}
	return dst
}

// An image of the directory taken while the store runs (no Close, no
// flush) holds every acknowledged record: what kill -9 leaves.
func TestStore_UncleanShutdownKeepsAcknowledgedRecords(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxAge: 1})
	st := openStore(t, cfg)
	s := st.Stream("s")
	appendN(t, s, 3000, 300)
	if _, err := s.ApplyRetention(context.Background(), timeAfterAll()); err != nil { // start moves to 3000
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := s.Append(context.Background(), rec("a", fmt.Sprint("late", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Truncate(context.Background(), 3040); err != nil {
		t.Fatal(err)
	}
	crashed := cfg
	crashed.Dir = copyDir(t, cfg.Dir)
	s2 := openStore(t, crashed).Stream("s")
	if s2.FirstOffset() != 3000 || s2.NextOffset() != 3040 {
		t.Fatalf("after the crash first %d next %d, want 3000 and 3040", s2.FirstOffset(), s2.NextOffset())
	}
	recs := readAll(t, s2, 3000)
	if len(recs) != 40 || string(recs[39].Payload) != "late39" {
		t.Fatalf("after the crash read %d records", len(recs))
	}
	if s2.Bytes() != s.Bytes() {
		t.Fatalf("after the crash Bytes %d, want %d", s2.Bytes(), s.Bytes())
	}
}

// timeAfterAll is a moment when every record written so far is older than
// a 1 ns MaxAge.
func timeAfterAll() time.Time { return time.Now().Add(time.Second) }

// The leader-epoch cache in a crash image is the one the store answered
// from: each epoch's start is written with the records that start it, and
// a truncation's trim with its last transaction.
func TestStore_UncleanShutdownKeepsTheEpochCache(t *testing.T) {
	cfg := testConfig(t)
	s := openStore(t, cfg).Stream("default")
	appendInEpoch(t, s, 1, 1500) // [0, 1500)
	appendInEpoch(t, s, 2, 100)  // [1500, 1600)
	appendInEpoch(t, s, 7, 100)  // [1600, 1700)
	if err := s.Truncate(context.Background(), 1650); err != nil {
		t.Fatal(err)
	}
	appendInEpoch(t, s, 8, 10) // [1650, 1660)
	want := []epochAnswer{{0, 0, 0, true}, {1, 1, 1500, true}, {2, 2, 1600, true}, {7, 7, 1650, true}, {8, 8, 1660, true}, {9, 0, 0, false}}
	checkEpochs(t, s, want)
	crashed := cfg
	crashed.Dir = copyDir(t, cfg.Dir)
	s2 := openStore(t, crashed).Stream("default")
	checkEpochs(t, s2, want)
	if e, start, ok := s2.LatestEpoch(); e != 8 || start != 1650 || !ok {
		t.Fatalf("LatestEpoch after the crash = %d, %d, %v; want 8, 1650", e, start, ok)
	}
}

// A crash image opens with the high watermark last persisted, not the log
// start: SyncHighWatermark persists it at once.
func TestStore_UncleanShutdownKeepsTheHighWatermark(t *testing.T) {
	cfg := manualConfig(t)
	s := openStore(t, cfg).Stream("default")
	appendN(t, s, 2000, 100)
	setHW(t, s, 1500)
	if err := s.SyncHighWatermark(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Truncate(context.Background(), 1800); err != nil {
		t.Fatal(err)
	}
	crashed := cfg
	crashed.Dir = copyDir(t, cfg.Dir)
	s2 := openStore(t, crashed).Stream("default")
	if s2.Committed() != 1500 || s2.NextOffset() != 1800 {
		t.Fatalf("after the crash committed %d next %d, want 1500 and 1800", s2.Committed(), s2.NextOffset())
	}
	if recs := readAll(t, s2, 0); len(recs) != 1500 {
		t.Fatalf("after the crash read %d records, want 1500", len(recs))
	}
	if err := s2.ResetTo(context.Background(), 5000); err != nil {
		t.Fatal(err)
	}
	crashed.Dir = copyDir(t, crashed.Dir)
	s3 := openStore(t, crashed).Stream("default")
	if s3.FirstOffset() != 5000 || s3.NextOffset() != 5000 || s3.Committed() != 5000 || s3.Bytes() != 0 {
		t.Fatalf("after a reset and a crash first %d next %d committed %d bytes %d, want 5000, 5000, 5000, 0",
			s3.FirstOffset(), s3.NextOffset(), s3.Committed(), s3.Bytes())
	}
}

// SetHighWatermark publishes at once and persists lazily: a crash image
// taken at once may open with a lower watermark (never a higher one), and
// a reader at the offset it had reached waits there instead of being told
// it is out of range; a little later the write has landed by itself.
func TestStore_HighWatermarkPersistsLazily(t *testing.T) {
	cfg := manualConfig(t)
	s := openStore(t, cfg).Stream("default")
	appendN(t, s, 200, 10)
	setHW(t, s, 50)
	if err := s.SyncHighWatermark(context.Background()); err != nil {
		t.Fatal(err)
	}
	setHW(t, s, 150) // published: readers see 150
	if recs := readAll(t, s, 0); len(recs) != 150 {
		t.Fatalf("read %d records, want the 150 below the watermark", len(recs))
	}

	crashed := cfg
	crashed.Dir = copyDir(t, cfg.Dir)
	s2 := openStore(t, crashed).Stream("default")
	if c := s2.Committed(); c < 50 || c > 150 || s2.NextOffset() != 200 {
		t.Fatalf("a crash image opened with committed %d next %d, want committed in [50, 150] and next 200", c, s2.NextOffset())
	}
	if recs, err := s2.Read(150, 0, 0); err != nil || len(recs) != 0 {
		t.Fatalf("Read(150) after the crash = %d records, %v; want none and no error (wait there)", len(recs), err)
	}
	if _, err := s2.Read(201, 0, 0); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("Read(201) past the log end = %v, want ErrOffsetOutOfRange", err)
	}
	setHW(t, s2, 160)
	if recs, err := s2.Read(150, 0, 0); err != nil || len(recs) != 10 || recs[0].Offset != 150 {
		t.Fatalf("Read(150) once the watermark moved again = %d records, %v; want 10 from 150", len(recs), err)
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		crashed.Dir = copyDir(t, cfg.Dir)
		s3 := openStore(t, crashed).Stream("default")
		if c := s3.Committed(); c == 150 {
			break
		} else if c > 150 {
			t.Fatalf("a crash image opened with committed %d above the 150 ever published", c)
		}
		if time.Now().After(deadline) {
			t.Fatal("the published watermark 150 was never written without SyncHighWatermark")
		}
		time.Sleep(hwPersistDelay)
	}
}
