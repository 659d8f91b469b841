//go:build linux

package logstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// smallDiskRun is what pushThrough saw.
type smallDiskRun struct {
	acked, peak   int64 // bytes acknowledged; the most disk the store took
	refused       int   // appends refused for space
	firstRefusal  int64 // acked bytes when the first refusal came; -1: none
	refusedSince  time.Time
	longestRefuse time.Duration
}

// smallDiskPatience bounds each small-disk test: a passing run takes 5-30
// s (race detector on, shared machine); one that stays refused runs into
// it.
const smallDiskPatience = 2 * time.Minute

// pushThrough publishes records of payload bytes to s until want bytes are
// acknowledged or the deadline passes, publishing on through refusals for
// space (as sensors would), and samples the disk the store takes in dir
// after every MiB.
func pushThrough(t *testing.T, s *Stream, dir string, payload, want int64, deadline time.Time) smallDiskRun {
	t.Helper()
	r := smallDiskRun{firstRefusal: -1}
	per := max(1, int(256*kib/payload))
	body := make([]byte, payload)
	var sampled int64
	for r.acked < want && time.Now().Before(deadline) {
		recs := make([]*Record, per)
		for i := range recs {
			recs[i] = &Record{Topic: "sensors/cam", Payload: body, QoS: 1}
		}
		_, err := s.Append(context.Background(), recs...)
		switch {
		case errors.Is(err, ErrNoSpace):
			r.refused++
			if r.firstRefusal < 0 {
				r.firstRefusal = r.acked
			}
			if r.refusedSince.IsZero() {
				r.refusedSince = time.Now()
			}
			r.longestRefuse = max(r.longestRefuse, time.Since(r.refusedSince))
			time.Sleep(5 * time.Millisecond)
			continue
		case err != nil:
			t.Fatalf("append after %d bytes acknowledged: %v", r.acked, err)
		}
		r.refusedSince = time.Time{}
		r.acked += int64(per) * payload
		if r.acked-sampled >= mib {
			sampled = r.acked
			r.peak = max(r.peak, diskBytes(t, dir))
		}
	}
	r.peak = max(r.peak, diskBytes(t, dir))
	return r
}

// A store refusing appends for lack of space must accept them again once
// retention has given back what it drops, without waiting for the
// retention loop (30 s) or for a whole block of offsets (it used to wait
// for both: 16 KiB records never fill a block, so the refusal lasted for
// good). Here the records are past max_age when another program fills the
// disk to below the reserve.
func TestStore_SmallDiskRefusingRecoversAsRetentionFrees(t *testing.T) {
	if testing.Short() {
		t.Skip("writes about 150 MiB to a loop-mounted filesystem")
	}
	mnt := mountSmallFS(t, 200)
	const maxAge, payload = 2 * time.Second, 16 * kib
	cfg := Config{
		Dir:     filepath.Join(mnt, "db"),
		Profile: ProfilePiZero,
		Streams: []StreamConfig{{Name: "cam", Filters: []string{"#"}, MaxAge: maxAge}},
	}
	st := openStore(t, cfg)
	s := st.Stream("cam")
	deadline := time.Now().Add(smallDiskPatience)
	run := pushThrough(t, s, cfg.Dir, payload, 48*mib, deadline)
	if run.refused > 0 || run.acked < 48*mib {
		t.Fatalf("filling the store: %d MiB acknowledged, %d appends refused", run.acked>>20, run.refused)
	}
	time.Sleep(maxAge + 100*time.Millisecond) // every record is past max_age

	free, err := diskFree(mnt)
	if err != nil {
		t.Fatal(err)
	}
	reserve := st.space.reserve()
	if err := fillFile(filepath.Join(mnt, "filler"), int64(free)-reserve+2*mib); err != nil {
		t.Fatal(err)
	}
	before := s.NextOffset()
	run = pushThrough(t, s, cfg.Dir, payload, 16*mib, deadline)
	t.Logf("disk filled to %d MiB below the %d MiB reserve: %d appends refused for up to %v, then %d MiB acknowledged",
		2, reserve>>20, run.refused, run.longestRefuse, run.acked>>20)
	if run.firstRefusal != 0 {
		t.Fatalf("the first append after the disk filled was not refused (%d bytes acknowledged first): the test filled it wrongly", run.firstRefusal)
	}
	if run.acked < 16*mib || s.NextOffset() <= before {
		t.Fatalf("only %d MiB acknowledged in %v after the disk filled (%d refused): retention did not give the disk back",
			run.acked>>20, smallDiskPatience, run.refused)
	}
	if got := readAll(t, s, s.FirstOffset()); uint64(len(got)) != s.NextOffset()-s.FirstOffset() {
		t.Fatalf("read %d records of [%d, %d)", len(got), s.FirstOffset(), s.NextOffset())
	}
}

// On a small filesystem, a stream of large records under max_bytes must
// keep publishing for good: retention gives the disk back as it goes (it
// used to wait for a whole block of 65536 offsets, which 16 KiB records
// never fill before the disk does: after 118 MiB every publish was
// refused, forever), and the disk the store takes stays within DiskBound.
func TestStore_SmallDiskKeepsAcceptingUnderRetention(t *testing.T) {
	if testing.Short() {
		t.Skip("writes about 250 MiB to a loop-mounted filesystem")
	}
	mnt := mountSmallFS(t, 200)
	const maxBytes, payload = 8 * mib, 16 * kib
	cfg := Config{
		Dir:     filepath.Join(mnt, "db"),
		Profile: ProfilePiZero,
		Streams: []StreamConfig{{Name: "cam", Filters: []string{"#"}, MaxBytes: maxBytes}},
		// Retention and reclaim intervals and the free-space reserve are
		// the defaults, as a node runs them.
	}
	st := openStore(t, cfg)
	s := st.Stream("cam")
	bound := st.DiskBound()
	deadline := time.Now().Add(smallDiskPatience)

	// The filesystem holds about 150 MiB above the reserve: push more
	// than that (three times as much without the race detector).
	want := int64(48 * maxBytes)
	if raceEnabled {
		want /= 2
	}
	run := pushThrough(t, s, cfg.Dir, payload, want, deadline)
	t.Logf("pushed %d MiB through max_bytes %d MiB: peak %d MiB on disk (bound %d MiB), %d appends refused",
		run.acked>>20, maxBytes>>20, run.peak>>20, bound>>20, run.refused)
	if run.refused > 0 {
		t.Fatalf("publishes refused for space after %d MiB acknowledged (%d refused, for up to %v): retention does not give the disk back",
			run.firstRefusal>>20, run.refused, run.longestRefuse)
	}
	if run.acked < want {
		t.Fatalf("only %d of %d MiB acknowledged in %v", run.acked>>20, want>>20, smallDiskPatience)
	}
	if run.peak > bound {
		t.Fatalf("the store took %d bytes on disk, above its bound of %d", run.peak, bound)
	}

	if got := readAll(t, s, s.FirstOffset()); uint64(len(got)) != s.NextOffset()-s.FirstOffset() {
		t.Fatalf("read %d records of [%d, %d)", len(got), s.FirstOffset(), s.NextOffset())
	}
}

// fillFile writes n bytes (in whole MiB) to a new file at path.
func fillFile(path string, n int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, mib)
	for ; n > 0; n -= mib {
		if _, err := f.Write(buf[:min(n, mib)]); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
