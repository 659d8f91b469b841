package logstore

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// bigRecords appends n records of payload bytes, one per append.
func bigRecords(tb testing.TB, s *Stream, n, payload int) {
	tb.Helper()
	body := make([]byte, payload)
	for range n {
		if _, err := s.Append(context.Background(), &Record{Topic: "cam", Payload: body, QoS: 1}); err != nil {
			tb.Fatalf("Append: %v", err)
		}
	}
}

// A commit that takes a stream a sixteenth past max_bytes applies
// retention at once: the stream does not wait for the retention loop (an
// hour here) to shrink.
func TestRetention_AppliedByCommitsPastMaxBytes(t *testing.T) {
	const maxBytes, payload = 256 * kib, 4 * kib
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxBytes: maxBytes})
	s := openStore(t, cfg).Stream("s")
	recBytes := recordBytes(len(encodeRecord(nil, &Record{Topic: "cam", Payload: make([]byte, payload), QoS: 1})))
	within := int((maxBytes + maxBytes/16) / recBytes) // appends that stay within the slack
	bigRecords(t, s, within, payload)
	if s.FirstOffset() != 0 {
		t.Fatalf("FirstOffset = %d with %d bytes, within max_bytes and its slack: retention ran too early", s.FirstOffset(), s.Bytes())
	}
	bigRecords(t, s, 200, payload)
	// The last commit's retention runs after its append is acknowledged:
	// one more append waits for it.
	bigRecords(t, s, 1, payload)
	if s.FirstOffset() == 0 {
		t.Fatalf("FirstOffset 0 with %d bytes for max_bytes %d: commits applied no retention", s.Bytes(), maxBytes)
	}
	if limit := int64(maxBytes+maxBytes/16) + 2*recBytes; s.Bytes() > limit {
		t.Fatalf("Bytes = %d after appends, want at most %d (max_bytes, its slack and a record)", s.Bytes(), limit)
	}
}

// Large records never fill a 65536-offset block: a reclaim is due by
// the bytes retention dropped, and gives back the keys below the log start
// in the partly dropped block, whatever ReclaimInterval says.
func TestReclaim_ByBytesGivesBackAPartialBlock(t *testing.T) {
	const maxBytes, payload = 1 * mib, 16 * kib
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxBytes: maxBytes})
	cfg.ReclaimInterval = time.Hour
	st := openStore(t, cfg)
	s := st.Stream("s")
	bigRecords(t, s, 256, payload) // 4 MiB
	time.Sleep(reclaimMinGap)      // a reclaim by bytes may run again
	if _, err := s.ApplyRetention(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	first := s.FirstOffset()
	if first < 150 {
		t.Fatalf("FirstOffset = %d after 4 MiB of 16 KiB records under max_bytes 1 MiB", first)
	}
	left := keysUnder(t, s, 0, first)
	threshold := s.reclaimThreshold()
	if int64(left)*payload > threshold+2*payload {
		t.Fatalf("%d keys of the %d records below the log start are still stored (reclaims: %v), want what the %d-byte threshold leaves",
			left, first, counterValue(t, st.metrics.Reclaims), threshold)
	}
	if recs, err := s.Read(first, 1, 0); err != nil || len(recs) != 1 || recs[0].Offset != first {
		t.Fatalf("Read(FirstOffset) after reclaim = %v, %v", recs, err)
	}
}

// While appends are refused for lack of space, what retention dropped is
// given back at once, below the threshold too, and after a restart too
// (which forgets how much it was).
func TestReclaim_WhileRefusingForSpace(t *testing.T) {
	t.Run("running", func(t *testing.T) { testReclaimWhileRefusing(t, false) })
	t.Run("after a restart", func(t *testing.T) { testReclaimWhileRefusing(t, true) })
}

func testReclaimWhileRefusing(t *testing.T, restart bool) {
	const maxBytes, payload = 4 * mib, 16 * kib
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxBytes: maxBytes})
	cfg.MinFreeBytes = 64 * mib
	var free atomic.Uint64
	free.Store(1 << 40)
	cfg.FreeSpace = func(string) (uint64, uint64, error) { return free.Load(), 1 << 41, nil }
	st := openStore(t, cfg)
	st.space.every = 0
	s := st.Stream("s")
	// Past max_bytes by less than a reclaim's threshold (a quarter).
	bigRecords(t, s, int((maxBytes+maxBytes/8)/payload), payload)
	first := s.FirstOffset()
	if first == 0 {
		t.Fatal("retention dropped nothing")
	}
	if left := keysUnder(t, s, 0, first); left == 0 {
		t.Fatalf("all %d records below the log start already given back: no test", first)
	}
	if restart {
		// Within max_bytes: retention after the restart drops nothing.
		if _, err := s.ApplyRetention(context.Background(), time.Now()); err != nil {
			t.Fatal(err)
		}
		if left := keysUnder(t, s, 0, s.FirstOffset()); left == 0 {
			t.Fatal("all records below the log start given back before the restart: no test")
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		st = openStore(t, cfg)
		st.space.every = 0
		s = st.Stream("s")
	}
	// With no room for a reclaim's own writes, the store waits.
	free.Store(1000)
	if _, err := s.Append(context.Background(), rec("a", "b")); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Append on a full disk = %v, want ErrNoSpace", err)
	}
	if _, err := s.ApplyRetention(context.Background(), time.Now()); err != nil { // after the refused appender's turn
		t.Fatal(err)
	}
	if n := counterValue(t, st.metrics.Reclaims); n != 0 || keysUnder(t, s, 0, s.FirstOffset()) == 0 {
		t.Fatalf("%v reclaims with 1000 bytes free: a reclaim ran on a full disk", n)
	}
	// Below the reserve, with room to reclaim.
	free.Store(32 * mib)
	time.Sleep(reclaimMinGap)
	if _, err := s.Append(context.Background(), rec("a", "b")); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Append below the reserve = %v, want ErrNoSpace", err)
	}
	// The refused appender reclaims after it has answered.
	deadline := time.Now().Add(10 * time.Second)
	for keysUnder(t, s, 0, s.FirstOffset()) > 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if left := keysUnder(t, s, 0, s.FirstOffset()); left > 1 {
		t.Fatalf("%d keys below the log start %d still stored after a refusal for space", left, s.FirstOffset())
	}
	if !st.Space().Refusing {
		t.Fatal("Space().Refusing false while appends are refused")
	}
	free.Store(1 << 40)
	if _, err := s.Append(context.Background(), rec("a", "b")); err != nil {
		t.Fatalf("Append once space returned: %v", err)
	}
	if sp := st.Space(); sp.Refusing || sp.Free != 1<<40 || sp.Size != 1<<41 || sp.Reserve != 64*mib {
		t.Fatalf("Space() = %+v once space returned", sp)
	}
}

func TestPartialPrefixes(t *testing.T) {
	const id = 7
	run := func(r uint64) []byte { return runPrefix(id, r) }
	key := func(off uint64) []byte { return recordKey(id, off) }
	for _, tc := range []struct {
		name             string
		lasts            []uint64
		start            uint64
		soleRun, soleKey map[uint64]bool
		want             [][]byte
		wantTo           uint64
	}{
		{name: "nothing", start: 10, want: nil, wantTo: 0},
		{name: "runs wholly below the start go as one prefix each, the rest key by key",
			lasts: []uint64{100, 255, 300, 511, 600, 610}, start: 620,
			want: [][]byte{run(0), run(1), key(600), key(610)}, wantTo: 611},
		{name: "a run that holds a table of its own goes key by key",
			lasts: []uint64{100, 255, 300, 511}, start: 600, soleRun: map[uint64]bool{1: true},
			want: [][]byte{run(0), key(300), key(511)}, wantTo: 512},
		{name: "a batch that is a table alone stays",
			lasts: []uint64{520, 530, 540}, start: 545, soleKey: map[uint64]bool{530: true},
			want: [][]byte{key(520), key(540)}, wantTo: 541},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, to := partialPrefixes(id, tc.lasts, tc.start, tc.soleRun, tc.soleKey)
			if len(got) != len(tc.want) || to != tc.wantTo {
				t.Fatalf("got %x up to %d, want %x up to %d", got, to, tc.want, tc.wantTo)
			}
			for i := range got {
				if !bytes.Equal(got[i], tc.want[i]) {
					t.Fatalf("prefix %d = %x, want %x", i, got[i], tc.want[i])
				}
			}
		})
	}
	// A run prefix is the 12 bytes its 256 record keys share.
	if p := runPrefix(id, 3); !bytes.HasPrefix(key(3<<8), p) || !bytes.HasPrefix(key(3<<8+255), p) || bytes.HasPrefix(key(4<<8), p) {
		t.Fatalf("runPrefix(3) = %x", p)
	}
}

func TestProfile_ReserveScalesWithTheFilesystem(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		p      Profile
		fsSize uint64
		want   int64
	}{
		// The floor: two value-log files and two memtables.
		{ProfilePiZero, 200 * mib, 2*16*mib + 2*4*mib},
		{ProfileServer, 200 * mib, 2*32*mib + 2*2*mib},
		// A twentieth of the filesystem in between.
		{ProfilePiZero, 1 * gib, gib / 20},
		{ProfilePi, 2 * gib, 2 * gib / 20},
		{ProfileServer, 4 * gib, 4 * gib / 20},
		// The profile's reserve at most.
		{ProfilePiZero, 16 * gib, 64 * mib},
		{ProfilePi, 16 * gib, 128 * mib},
		{ProfileServer, 500 * gib, 512 * mib},
	} {
		if got := tc.p.Reserve(tc.fsSize); got != tc.want {
			t.Errorf("%s.Reserve(%d MiB) = %d MiB, want %d MiB", tc.p, tc.fsSize>>20, got>>20, tc.want>>20)
		}
	}
}

// With MinFreeBytes 0 the store keeps the profile's reserve scaled to its
// filesystem: the server profile's 512 MiB would refuse every append on a
// 1 GiB card with 400 MiB free.
func TestStore_ReserveScaledToTheFilesystem(t *testing.T) {
	cfg := testConfig(t)
	cfg.Profile = ProfileServer
	cfg.MinFreeBytes = 0
	cfg.FreeSpace = func(string) (uint64, uint64, error) { return 400 * mib, 1 << 30, nil }
	st := openStore(t, cfg)
	if _, err := st.Stream("default").Append(context.Background(), rec("a", "b")); err != nil {
		t.Fatalf("Append with 400 MiB free on a 1 GiB filesystem: %v", err)
	}
	if sp := st.Space(); sp.Reserve != ProfileServer.Reserve(1<<30) || sp.Refusing || !sp.Known {
		t.Fatalf("Space() = %+v, want the reserve of a 1 GiB filesystem (%d)", sp, ProfileServer.Reserve(1<<30))
	}
}
