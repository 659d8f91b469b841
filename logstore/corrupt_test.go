package logstore

import (
	"context"
	"errors"
	"testing"

	badger "github.com/dgraph-io/badger/v4"
)

func TestRead_CorruptRecordIsReportedWithStreamAndOffset(t *testing.T) {
	st := openStore(t, testConfig(t, StreamConfig{Name: "telemetry", Filters: []string{"#"}}))
	s := st.Stream("telemetry")
	appendN(t, s, 10, 10)
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
