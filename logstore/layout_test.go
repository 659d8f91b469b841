package logstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// layout1Store writes, with a bare Badger, what a Peat of key layout 1 left
// in dir: stream "s" (id 1) with records [0, n) of which retention kept
// [start, n) (start a multiple of 1024: the hidden chunks keep their stats
// keys until reclaimed, as in layout 1), stream "u" (id 2) with 10 records,
// and one consumer state entry. The keys are spelled out byte by byte,
// independent of the constants the code uses now. With interrupted, half of
// the chunk keys are already under their layout 2 tag, as a crash in the
// middle of a migration leaves them. It returns the records of "s" from
// start on.
func layout1Store(tb testing.TB, dir string, n, start uint64, interrupted bool) []*Record {
	tb.Helper()
	opts := ProfilePiZero.badgerOptions().WithDir(dir).WithValueDir(dir).WithLogger(nil)
	db, err := badger.Open(opts)
	if err != nil {
		tb.Fatal(err)
	}
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	var kept []*Record
	write := func(fn func(txn *badger.Txn) error) {
		tb.Helper()
		if err := db.Update(fn); err != nil {
			tb.Fatal(err)
		}
	}
	key := func(tag byte, id uint32, off uint64) []byte {
		return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32([]byte{tag}, id), off)
	}
	stream := func(id uint32, count uint64, keep func(off uint64, r *Record)) {
		chunks := map[uint64]*chunk{}
		for lo := uint64(0); lo < count; lo += 500 {
			write(func(txn *badger.Txn) error {
				for off := lo; off < min(lo+500, count); off++ {
					r := &Record{Offset: off, Timestamp: t0 + int64(off)*1000, Topic: fmt.Sprintf("t/%d/%d", id, off),
						Payload: []byte(fmt.Sprintf("p%d", off)), QoS: 1, ClientID: "c", Epoch: 3}
					k, v := key('r', id, off), encodeRecord(nil, r)
					if err := txn.Set(k, v); err != nil {
						return err
					}
					cs := off &^ (chunkSize - 1)
					if chunks[cs] == nil {
						chunks[cs] = &chunk{start: cs}
					}
					chunks[cs].add(r.Timestamp, int64(len(k)+len(v)))
					keep(off, r)
				}
				return nil
			})
		}
		write(func(txn *badger.Txn) error {
			for cs, c := range chunks {
				tag := byte('c')
				if interrupted && cs/chunkSize%2 == 0 {
					tag = 's'
				}
				if err := txn.Set(key(tag, id, cs), c.encode()); err != nil {
					return err
				}
			}
			return nil
		})
	}
	write(func(txn *badger.Txn) error {
		for name, id := range map[string]uint32{"s": 1, "u": 2} {
			if err := txn.Set(append([]byte("mn"), name...), binary.BigEndian.AppendUint32(nil, id)); err != nil {
				return err
			}
		}
		if err := txn.Set(binary.BigEndian.AppendUint32([]byte("ms"), 1), binary.BigEndian.AppendUint64(nil, start)); err != nil {
			return err
		}
		return txn.Set([]byte("kgroup/g1/s"), []byte("4242"))
	})
	stream(1, n, func(off uint64, r *Record) {
		if off >= start {
			kept = append(kept, r)
		}
	})
	stream(2, 10, func(uint64, *Record) {})
	if err := db.Close(); err != nil {
		tb.Fatal(err)
	}
	return kept
}

func TestLayout_MigratesLayout1Store(t *testing.T) {
	for _, interrupted := range []bool{false, true} {
		t.Run(fmt.Sprintf("interrupted=%v", interrupted), func(t *testing.T) {
			cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"s/#"}}, StreamConfig{Name: "u", Filters: []string{"u/#"}})
			const n, start = 5000, 2048
			want := layout1Store(t, cfg.Dir, n, start, interrupted)
			var wantBytes int64
			for _, r := range want {
				wantBytes += int64(recordKeyLen + len(encodeRecord(nil, r)))
			}

			wantNext := uint64(n)
			for pass := range 2 { // the migration, then a plain reopen
				st, err := Open(cfg)
				if err != nil {
					t.Fatalf("Open (pass %d): %v", pass, err)
				}
				s := st.Stream("s")
				if s.FirstOffset() != start || s.NextOffset() != wantNext || s.Bytes() != wantBytes {
					t.Fatalf("pass %d: first/next/bytes = %d/%d/%d, want %d/%d/%d", pass,
						s.FirstOffset(), s.NextOffset(), s.Bytes(), start, wantNext, wantBytes)
				}
				got := readAll(t, s, start)
				if len(got) != len(want) {
					t.Fatalf("pass %d: read %d records, want %d", pass, len(got), len(want))
				}
				for i, r := range got {
					w := want[i]
					if r.Offset != w.Offset || r.Timestamp != w.Timestamp || r.Topic != w.Topic || string(r.Payload) != string(w.Payload) || r.Epoch != w.Epoch {
						t.Fatalf("pass %d: record %d = %+v, want %+v", pass, i, r, w)
					}
				}
				// The time index: chunk stats found, then one chunk scanned.
				for _, off := range []uint64{start, start + 1, 3000, 4095, 4096, n - 1} {
					ts := want[off-start].Timestamp
					for _, d := range []int64{0, -500} { // exactly, and between two records
						if got, err := s.OffsetForTime(time.UnixMilli(ts + d)); err != nil || got != off {
							t.Fatalf("pass %d: OffsetForTime(record %d %+d ms) = %d, %v; want %d", pass, off, d, got, err, off)
						}
					}
				}
				if got, _ := s.OffsetForTime(time.UnixMilli(0)); got != start {
					t.Fatalf("pass %d: OffsetForTime(long ago) = %d, want the log start %d", pass, got, start)
				}
				if got, _ := s.OffsetForTime(time.UnixMilli(want[len(want)-1].Timestamp + 1)); got != wantNext {
					t.Fatalf("pass %d: OffsetForTime(after the last) = %d, want %d", pass, got, wantNext)
				}
				if u := st.Stream("u"); u.NextOffset() != 10 || len(readAll(t, u, 0)) != 10 {
					t.Fatalf("pass %d: stream u next %d", pass, u.NextOffset())
				}
				state := map[string]string{}
				if err := st.LoadState("", func(k string, v []byte) error { state[k] = string(v); return nil }); err != nil {
					t.Fatal(err)
				}
				if len(state) != 1 || state["group/g1/s"] != "4242" {
					t.Fatalf("pass %d: state = %v", pass, state)
				}
				var old []string
				_ = st.db.View(func(txn *badger.Txn) error {
					it := txn.NewIterator(badger.IteratorOptions{})
					defer it.Close()
					for it.Rewind(); it.Valid(); it.Next() {
						if k := it.Item().Key(); strings.IndexByte("ckm", k[0]) >= 0 {
							old = append(old, fmt.Sprintf("%q", k))
						}
					}
					return nil
				})
				if len(old) > 0 {
					t.Fatalf("pass %d: layout 1 keys left: %v", pass, old)
				}
				if pass == 0 { // appends go on; the next pass reads this one back too
					r := rec("s/new", "x")
					r.Timestamp = want[len(want)-1].Timestamp + 1000
					first, err := s.Append(context.Background(), r)
					if err != nil || first != n {
						t.Fatalf("Append after migration = %d, %v; want %d", first, err, n)
					}
					want = append(want, r)
					wantNext, wantBytes = n+1, s.Bytes()
				}
				if err := st.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestLayout_RefusesANewerLayout(t *testing.T) {
	cfg := testConfig(t)
	st := openStore(t, cfg)
	if err := st.db.Update(func(txn *badger.Txn) error {
		return txn.Set(layoutKey(), binary.BigEndian.AppendUint32(nil, layoutVersion+1))
	}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := Open(cfg)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("key layout %d", layoutVersion+1)) {
		t.Fatalf("Open of a newer layout = %v, want a key layout error", err)
	}
}
