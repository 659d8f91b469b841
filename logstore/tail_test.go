package logstore

import (
	"fmt"
	"testing"
)

func tailRecs(first uint64, n, payload int) []*Record {
	recs := make([]*Record, n)
	for i := range recs {
		recs[i] = &Record{Offset: first + uint64(i), Topic: "t", Payload: make([]byte, payload)}
	}
	return recs
}

func TestTail(t *testing.T) {
	offsets := func(recs []*Record) string {
		if len(recs) == 0 {
			return "[]"
		}
		return fmt.Sprintf("[%d..%d]", recs[0].Offset, recs[len(recs)-1].Offset)
	}
	t.Run("serves what it holds, below the watermark, within the limits", func(t *testing.T) {
		var tl tail
		tl.add(100, tailRecs(100, 10, 8))
		for _, c := range []struct {
			from, hw  uint64
			max, maxB int
			want      string
			ok        bool
		}{
			{100, 110, 0, 0, "[100..109]", true},
			{105, 110, 3, 0, "[105..107]", true},
			{105, 108, 0, 0, "[105..107]", true},
			{100, 110, 0, 1, "[100..100]", true}, // at least one record
			{99, 110, 0, 0, "", false},           // evicted or never cached: read Badger
			{110, 110, 0, 0, "", false},
		} {
			got, ok := tl.read(c.from, c.hw, c.max, c.maxB)
			if ok != c.ok || (ok && offsets(got) != c.want) {
				t.Errorf("read(%d, hw %d, %d, %d) = %s, %v; want %s, %v", c.from, c.hw, c.max, c.maxB, offsets(got), ok, c.want, c.ok)
			}
		}
	})
	t.Run("keeps the newest records within its bounds", func(t *testing.T) {
		var tl tail
		tl.add(0, tailRecs(0, tailRecords+5, 1))
		if _, ok := tl.read(4, 1<<20, 0, 0); ok {
			t.Error("offset 4 still cached past the record bound")
		}
		if got, ok := tl.read(5, 1<<20, 1, 0); !ok || got[0].Offset != 5 {
			t.Errorf("offset 5 not served: %v %v", offsets(got), ok)
		}
		big := tailRecs(tailRecords+5, 3, tailBytes/2)
		tl.add(tailRecords+5, big)
		if tl.bytes > tailBytes {
			t.Errorf("holds %d bytes, bound %d", tl.bytes, tailBytes)
		}
		if got, ok := tl.read(tailRecords+7, 1<<20, 0, 0); !ok || got[0] != big[2] {
			t.Errorf("newest record not served: %v %v", offsets(got), ok)
		}
	})
	t.Run("a gap or a truncation starts over", func(t *testing.T) {
		var tl tail
		tl.add(0, tailRecs(0, 10, 1))
		tl.truncate(5)
		if _, ok := tl.read(5, 10, 0, 0); ok {
			t.Error("truncated offset 5 still served")
		}
		tl.add(5, tailRecs(5, 2, 1))
		if got, ok := tl.read(5, 10, 0, 0); !ok || offsets(got) != "[5..6]" {
			t.Errorf("re-appended records: %v %v", offsets(got), ok)
		}
		tl.add(20, tailRecs(20, 1, 1))
		if _, ok := tl.read(6, 30, 0, 0); ok {
			t.Error("records before a gap still served")
		}
	})
}
