package mirror

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/peatmq/peat/logstore"
)

func openMirror(t *testing.T, dir string) (*logstore.Store, *logstore.Stream) {
	t.Helper()
	cfg := logstore.DefaultConfig()
	cfg.Dir = dir
	cfg.Streams = []logstore.StreamConfig{{Name: "site-a.default", Mirror: true}}
	st, err := logstore.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st, st.Stream("site-a.default")
}

func rec(off uint64) Incoming {
	return Incoming{Offset: off, Record: &logstore.Record{Topic: fmt.Sprintf("t/%d", off), Payload: []byte(fmt.Sprint(off)), Timestamp: 1000 + int64(off), QoS: 1}}
}

// offsets reads the whole mirror: offset -> topic.
func offsets(t *testing.T, s *logstore.Stream) map[uint64]*logstore.Record {
	t.Helper()
	out := map[uint64]*logstore.Record{}
	rs, err := s.Read(s.FirstOffset(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		out[r.Offset] = r
	}
	return out
}

// TestApplyNextDuplicateGap: record N is appended at N only when N is the
// log end; a resend is acknowledged and not appended; a gap the source's
// retention made is marked at each missing offset; a gap the source can
// still fill is refused; all of it survives a reopen.
func TestApplyNextDuplicateGap(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	store, s := openMirror(t, dir)

	// An empty mirror starts where the source's records start.
	first := rec(5)
	first.First = 5
	res, errs := Apply(ctx, s, 0, []Incoming{first, rec(6), rec(7)})
	for i, r := range res {
		if r != Appended || errs[i] != nil {
			t.Fatalf("record %d: %v %v, want appended", i, r, errs[i])
		}
	}
	if s.FirstOffset() != 5 || s.NextOffset() != 8 {
		t.Fatalf("mirror holds %d..%d, want 5..7", s.FirstOffset(), s.NextOffset()-1)
	}

	// A rewind after a reconnect: 6 and 7 again, then 8 new.
	res, errs = Apply(ctx, s, 0, []Incoming{rec(6), rec(7), rec(8)})
	if res[0] != Duplicate || res[1] != Duplicate || res[2] != Appended || errors.Join(errs...) != nil {
		t.Fatalf("rewind: %v %v", res, errs)
	}
	if s.NextOffset() != 9 {
		t.Fatalf("next %d after duplicates, want 9", s.NextOffset())
	}

	// 12 arrives while the source still has 9..11: refused, nothing written.
	lost := rec(12)
	lost.First = 3
	res, errs = Apply(ctx, s, 0, []Incoming{lost})
	var me *MissingError
	if res[0] != Refused || !errors.As(errs[0], &me) || s.NextOffset() != 9 {
		t.Fatalf("transport gap: %v %v, next %d", res, errs, s.NextOffset())
	}

	// 12 after the source's retention dropped 9..11: markers at 9..11.
	dropped := rec(12)
	dropped.First = 12
	res, errs = Apply(ctx, s, 0, []Incoming{dropped, rec(13)})
	if res[0] != Appended || res[1] != Appended || errors.Join(errs...) != nil {
		t.Fatalf("retention gap: %v %v", res, errs)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}

	store, s = openMirror(t, dir)
	defer store.Close()
	got := offsets(t, s)
	for off := uint64(5); off <= 13; off++ {
		r := got[off]
		switch {
		case r == nil:
			t.Fatalf("offset %d missing", off)
		case off >= 9 && off <= 11:
			if r.Topic != GapTopic || len(r.UserProperties) != 1 || r.UserProperties[0].Value != "9-12" {
				t.Fatalf("offset %d: %+v, want a gap marker 9-12", off, r)
			}
		case r.Topic != fmt.Sprintf("t/%d", off) || string(r.Payload) != fmt.Sprint(off) || r.Timestamp != 1000+int64(off):
			t.Fatalf("offset %d holds %+v", off, r)
		}
	}
	if len(got) != 9 {
		t.Fatalf("%d records, want 9 (5..13)", len(got))
	}
}
