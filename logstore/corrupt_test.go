package logstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	badger "github.com/dgraph-io/badger/v4"
)

func TestRead_CorruptRecordIsReportedWithStreamAndOffset(t *testing.T) {
	st := openStore(t, testConfig(t, StreamConfig{Name: "telemetry", Filters: []string{"#"}}))
	s := st.Stream("telemetry")
	appendN(t, s, 10, 10)
	for _, off := range []uint64{1, 2, 4, 6, 8, 9} {
		isolate(t, s, off) // its own entry, as key layout 2 stored every record
	}
	for off, garbage := range map[uint64][]byte{
		4: []byte("definitely not a record"),
		6: {},
		8: append([]byte{valueVersion, 0, 0, 0, 0}, 0x93, 0xc1, 0xc1, 0xc1), // bad CRC
		// Valid CRC, but the payload claims 4 GiB: the decoder must refuse it.
		9: withCRC(9, []byte{0x94, 0x00, 0xa1, 'a', 0xc6, 0xff, 0xff, 0xff, 0xff}),
	} {
		if err := st.db.Update(func(txn *badger.Txn) error { return txn.Set(recordKey(s.id, off), garbage) }); err != nil {
			t.Fatal(err)
		}
	}
	// The bytes changed on disk under the tail cache, which still holds what
	// was written; forget it, as a restart would, so reads go to Badger.
	s.tail.truncate(0)
	recs, err := s.Read(0, 100, 0)
	if err != nil || len(recs) != 4 {
		t.Fatalf("Read(0) = %d records, %v; want the 4 before the corrupt one", len(recs), err)
	}
	for _, off := range []uint64{4, 6, 8, 9} {
		_, err = s.Read(off, 100, 0)
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.Stream != "telemetry" || ce.Offset != off || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Read(%d) = %v, want CorruptError for telemetry at %d", off, err, off)
		}
	}
	if recs, err := s.Read(5, 1, 0); err != nil || len(recs) != 1 || string(recs[0].Payload) != "p5" {
		t.Fatalf("Read(5) past the corruption = %v, %v", recs, err)
	}
	if got := counterValue(t, st.metrics.CorruptRecords.WithLabelValues("telemetry")); got != 4 {
		t.Fatalf("peat_log_corrupt_records_total = %v, want 4", got)
	}
	// A value copied under another offset fails too: the CRC covers the offset.
	var v []byte
	_ = st.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(recordKey(s.id, 1))
		if err != nil {
			return err
		}
		v, err = item.ValueCopy(nil)
		return err
	})
	_ = st.db.Update(func(txn *badger.Txn) error { return txn.Set(recordKey(s.id, 2), v) })
	if _, err := s.Read(2, 1, 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Read of a value moved to another offset = %v, want ErrCorrupt", err)
	}
	// Appends still work.
	if _, err := s.Append(context.Background(), rec("a", "x")); err != nil {
		t.Fatal(err)
	}
}

// Damage in Badger's tables (the bytes of a block, its trailer, an index)
// is reported, as an error from Open or a CorruptError with the stream and
// offset from Read, and never served as a record or turned into a panic.
func TestRead_DamagedTableIsReportedNotServed(t *testing.T) {
	const n = 20_000
	pristine := t.TempDir()
	cfg := testConfig(t, StreamConfig{Name: "telemetry", Filters: []string{"#"}})
	cfg.Dir = pristine
	// Batches (of 100 records here, about 3 KiB) inline in the tables, so
	// the damage hits record bytes, not only pointers into the value log.
	cfg.tune = func(p *profileSpec) { p.valueThreshold = maxBatchValue }
	st, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, st.Stream("telemetry"), n, 100) // payloads "p<i>": inline in the tables
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	tables, _ := filepath.Glob(filepath.Join(pristine, "*.sst"))
	if len(tables) == 0 {
		t.Fatal("no table written")
	}

	rng := rand.New(rand.NewPCG(1, 2))
	var refusedOpen, reported, clean int
	for trial := range 40 {
		dir := t.TempDir()
		if err := os.CopyFS(dir, os.DirFS(pristine)); err != nil {
			t.Fatal(err)
		}
		table := filepath.Join(dir, filepath.Base(tables[rng.IntN(len(tables))]))
		b, err := os.ReadFile(table)
		if err != nil {
			t.Fatal(err)
		}
		at, size := rng.IntN(len(b)), 1+rng.IntN(256)
		for i := at; i < min(at+size, len(b)); i++ {
			b[i] = byte(rng.Uint32())
		}
		if err := os.WriteFile(table, b, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg.Dir = dir
		st, err := Open(cfg)
		if err != nil {
			refusedOpen++
			continue
		}
		s := st.Stream("telemetry")
		found := false
		for off := uint64(0); off < s.Committed(); {
			recs, err := s.Read(off, 1000, 0)
			var ce *CorruptError
			switch {
			case errors.As(err, &ce) && ce.Stream == "telemetry" && ce.Offset == off:
				found = true
				off++
				continue
			case err != nil:
				t.Fatalf("trial %d (%d bytes at %d of %s): Read(%d) = %v, want records or a CorruptError at %d", trial, size, at, filepath.Base(table), off, err, off)
			}
			for _, r := range recs {
				if r.Offset != off || r.Topic != fmt.Sprintf("t/%d", off) || string(r.Payload) != fmt.Sprintf("p%d", off) {
					t.Fatalf("trial %d (%d bytes at %d of %s): offset %d served as %d %q %q", trial, size, at, filepath.Base(table), off, r.Offset, r.Topic, r.Payload)
				}
				off++
			}
		}
		if found {
			reported++
		} else {
			clean++ // the damage hit bytes no read uses (padding, a bloom filter)
		}
		if err := st.Close(); err != nil {
			t.Logf("trial %d: Close: %v", trial, err)
		}
	}
	t.Logf("40 damaged tables: %d refused at open, %d reported by Read, %d read clean", refusedOpen, reported, clean)
	if reported == 0 {
		t.Fatal("no damage was reported by Read: the test damaged nothing it reads")
	}
}
