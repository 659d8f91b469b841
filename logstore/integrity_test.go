package logstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// The storage integrity test runs small in `make test`; `make test-arm` runs
// it with -integrity.records=1000000 on armv7 and armv6 under qemu-arm.
var (
	integrityRecords = flag.Int("integrity.records", 20_000, "records the storage integrity test writes")
	integritySeed    = flag.Uint64("integrity.seed", 0, "seed of the integrity test's batch schedule (0: from the clock)")
	integrityProfile = flag.String("integrity.profile", "", "storage profile of the integrity test (empty: the one the store picks on this GOARCH)")
)

// TestStore_IntegrityAfterReopen writes records of varied sizes in varied
// batches with the profile the store picks on this GOARCH, closes the store,
// reopens it and reads every offset back. Each payload carries its offset
// and a CRC-32C of its content, so a lost, moved, truncated or corrupted
// record fails the test, which names the offsets.
func TestStore_IntegrityAfterReopen(t *testing.T) {
	n := *integrityRecords
	seed := *integritySeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	p := Profile(*integrityProfile).orDefault()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Dir:               t.TempDir(),
		Profile:           p,
		Streams:           []StreamConfig{{Name: "integrity", Filters: []string{"#"}}},
		RetentionInterval: time.Hour,
		MinFreeBytes:      -1,
		Logger:            testLogger(t),
	}
	spec := p.spec()
	shape := newIntegrityShape(n, spec)
	o := p.badgerOptions()
	t.Logf("%s/%s: profile %s: memtable %d MiB, base table %d MiB, table multiplier %d, compression %s, value threshold %d B, value log file %d MiB",
		runtime.GOOS, runtime.GOARCH, p, o.MemTableSize>>20, o.BaseTableSize>>20, o.TableSizeMultiplier, compressionName(o.Compression), o.ValueThreshold, o.ValueLogFileSize>>20)
	t.Logf("%d records, seed %d; a run of %d records just below the value threshold from offset %d", n, seed, shape.runLen, shape.runStart)

	start := time.Now()
	st, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	written := integrityWrite(t, st.Stream("integrity"), shape, seed)
	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wrote := time.Since(start)
	if t.Failed() {
		return
	}
	if vlog := filesSize(t, cfg.Dir, ".vlog"); vlog < shape.aboveBytes {
		t.Errorf("value log files hold %d bytes, want at least the %d bytes of payloads above the value threshold", vlog, shape.aboveBytes)
	}

	st, err = Open(cfg)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer st.Close()
	s := st.Stream("integrity")
	if s.FirstOffset() != 0 || s.NextOffset() != uint64(n) || s.Committed() != uint64(n) {
		t.Errorf("after reopen first %d next %d committed %d, want 0, %d, %d", s.FirstOffset(), s.NextOffset(), s.Committed(), n, n)
	}
	bad := integrityVerify(t, s, shape)
	t.Logf("wrote %d records (%d MiB of payload) in %v, verified in %v", n, written>>20, wrote.Round(time.Millisecond), (time.Since(start) - wrote).Round(time.Millisecond))
	if len(bad) > 0 {
		t.Fatalf("%d of %d offsets lost or corrupt (seed %d): %s", bad.count(), n, seed, bad)
	}
}

// integrityShape decides each offset's payload size, from the profile's
// value threshold: mostly small, some of a few KiB, every 1000th just
// above the threshold (stored in the value log), every 1000th just below it
// (stored inline in the tables), and one run of records just below it long
// enough to fill 2.5 memtables (tables made almost only of large entries),
// within 64 bytes per record of the test (a 64 MiB run for 1,000,000).
type integrityShape struct {
	n                  int
	threshold          int
	runStart, runLen   int
	aboveBytes         int64
	maxBatchBytes      int // bytes per Append call, at most
	maxInflightBytes   int // payload bytes handed over and not yet acknowledged
	maxInflightBatches int
}

func newIntegrityShape(n int, s profileSpec) integrityShape {
	sh := integrityShape{
		n:                  n,
		threshold:          int(s.valueThreshold),
		maxBatchBytes:      4 * mib,
		maxInflightBytes:   32 * mib,
		maxInflightBatches: 64,
	}
	sh.runLen = int(min(5*s.memTableSize/2, 64*int64(n)) / s.valueThreshold)
	sh.runStart = n / 2
	for off := range n {
		if size := sh.size(uint64(off)); size > sh.threshold {
			sh.aboveBytes += int64(size)
		}
	}
	return sh
}

// size is the payload size of offset off.
func (sh integrityShape) size(off uint64) int {
	h := mix64(off)
	r := int(h >> 40) // 24 bits: positive on 32-bit platforms too
	// An encoded record is a payload plus about 45 bytes: below is
	// stored inline, above in the value log.
	margin := min(64, sh.threshold*3/4)
	below := max(0, sh.threshold-margin-r%max(1, sh.threshold/4))
	if o := int(off); o >= sh.runStart && o < sh.runStart+sh.runLen {
		return below
	}
	switch h % 1000 {
	case 0:
		return sh.threshold + 1 + r%4096
	case 1:
		return below
	}
	switch p := h % 100; {
	case p < 85:
		return r % 128 // 0 to 127 bytes, the empty payload included
	case p < 98:
		return 128 + r%896
	default:
		return 1024 + r%7168
	}
}

// payload builds offset off's payload: its offset (8 bytes, big-endian) and
// a CRC-32C of the rest (4 bytes), then text that compresses well or
// pseudo-random bytes that do not. Payloads under 12 bytes are the first
// bytes of the offset's pseudo-random sequence.
func (sh integrityShape) payload(off uint64) []byte {
	b := make([]byte, sh.size(off))
	if len(b) < 12 {
		fillRandom(b, off)
		return b
	}
	binary.BigEndian.PutUint64(b, off)
	body := b[12:]
	if mix64(off^0x5bd1e995)%2 == 0 {
		line := fmt.Sprintf(`{"sensor":"s-%d","seq":%d,"temp":21.5,"unit":"C"}`, off%97, off)
		for i := 0; i < len(body); i += copy(body[i:], line) {
		}
	} else {
		fillRandom(body, off)
	}
	binary.BigEndian.PutUint32(b[8:], crc32.Checksum(body, castagnoli))
	return b
}

func (sh integrityShape) topic(off uint64) string { return fmt.Sprintf("integrity/%d", off%7) }

// check reports what is wrong with rec as offset off's record, or "".
func (sh integrityShape) check(off uint64, rec *Record) string {
	want := sh.size(off)
	switch {
	case rec.Offset != off:
		return fmt.Sprintf("record says offset %d", rec.Offset)
	case rec.Topic != sh.topic(off):
		return fmt.Sprintf("topic %q, want %q", rec.Topic, sh.topic(off))
	case len(rec.Payload) != want:
		return fmt.Sprintf("payload of %d bytes, want %d", len(rec.Payload), want)
	case want < 12:
		if !bytes.Equal(rec.Payload, sh.payload(off)) {
			return "payload bytes differ"
		}
	case binary.BigEndian.Uint64(rec.Payload) != off:
		return fmt.Sprintf("payload of offset %d", binary.BigEndian.Uint64(rec.Payload))
	case binary.BigEndian.Uint32(rec.Payload[8:]) != crc32.Checksum(rec.Payload[12:], castagnoli):
		return "payload fails its CRC"
	}
	return ""
}

// integrityWrite appends every offset's record with AppendAsync, in
// requests of 1 to 4096 records (at most maxBatchBytes), keeping up to
// maxInflightBatches requests in flight so the appender groups them as a
// busy broker's would be. It returns the payload bytes written.
func integrityWrite(t *testing.T, s *Stream, sh integrityShape, seed uint64) int64 {
	t.Helper()
	type result struct {
		want, first uint64
		bytes       int
		err         error
	}
	sizes := []int{1, 2, 7, 31, 128, 500, 1000, 4096}
	rng := rand.New(rand.NewPCG(seed, 0x1e5))
	done := make(chan result, sh.maxInflightBatches) // done must not block
	inflight, inflightBytes := 0, 0
	var total int64
	receive := func() bool {
		r := <-done
		inflight--
		inflightBytes -= r.bytes
		if r.err != nil {
			t.Errorf("append at %d: %v", r.want, r.err)
			return false
		}
		if r.first != r.want {
			t.Errorf("append got first offset %d, want %d", r.first, r.want)
			return false
		}
		return true
	}
	for off := 0; off < sh.n; {
		want := sizes[rng.IntN(len(sizes))]
		var recs []*Record
		b := 0
		for len(recs) < want && off < sh.n && (b == 0 || b+sh.size(uint64(off)) <= sh.maxBatchBytes) {
			p := sh.payload(uint64(off))
			recs = append(recs, &Record{Topic: sh.topic(uint64(off)), Payload: p, QoS: 1, ClientID: "integrity"})
			b += len(p)
			off++
		}
		for inflight >= sh.maxInflightBatches || inflightBytes >= sh.maxInflightBytes {
			if !receive() {
				return total
			}
		}
		first := uint64(off - len(recs))
		inflight++
		inflightBytes += b
		total += int64(b)
		s.AppendAsync(recs, func(got uint64, err error) { done <- result{first, got, b, err} })
	}
	for inflight > 0 {
		if !receive() {
			return total
		}
	}
	return total
}

// integrityVerify reads [0, n) and returns the offsets that are missing or
// wrong. A corrupt record is skipped, so every bad offset is found.
func integrityVerify(t *testing.T, s *Stream, sh integrityShape) badOffsets {
	t.Helper()
	var bad badOffsets
	var firstErr string
	note := func(off uint64, why string) {
		if firstErr == "" {
			firstErr = fmt.Sprintf("offset %d: %s", off, why)
		}
		bad.add(off)
	}
	end := uint64(sh.n)
	for off := uint64(0); off < end; {
		recs, err := s.Read(off, 4096, 8*mib)
		var ce *CorruptError
		switch {
		case errors.As(err, &ce):
			note(ce.Offset, ce.Err.Error())
			off = ce.Offset + 1
			continue
		case err != nil:
			t.Fatalf("Read(%d): %v", off, err)
		case len(recs) == 0:
			for ; off < end; off++ {
				note(off, "log ends early")
			}
		}
		for _, r := range recs {
			if why := sh.check(off, r); why != "" {
				note(off, why)
			}
			off++
		}
	}
	if firstErr != "" {
		t.Logf("first bad record: %s", firstErr)
	}
	return bad
}

// badOffsets is a sorted list of offset ranges [from, to].
type badOffsets [][2]uint64

func (b *badOffsets) add(off uint64) {
	if l := len(*b); l > 0 && (*b)[l-1][1]+1 == off {
		(*b)[l-1][1] = off
		return
	}
	*b = append(*b, [2]uint64{off, off})
}

func (b badOffsets) count() uint64 {
	var n uint64
	for _, r := range b {
		n += r[1] - r[0] + 1
	}
	return n
}

// String lists the first 20 ranges.
func (b badOffsets) String() string {
	var parts []string
	for i, r := range b {
		if i == 20 {
			parts = append(parts, fmt.Sprintf("and %d more ranges", len(b)-20))
			break
		}
		if r[0] == r[1] {
			parts = append(parts, fmt.Sprint(r[0]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", r[0], r[1]))
		}
	}
	return strings.Join(parts, ", ")
}

// mix64 is SplitMix64's finaliser: a well-spread hash of x.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// fillRandom fills b with a pseudo-random sequence determined by seed.
func fillRandom(b []byte, seed uint64) {
	x := seed
	for i := 0; i < len(b); i += 8 {
		x = mix64(x)
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], x)
		copy(b[i:], w[:])
	}
}

func compressionName(c options.CompressionType) string {
	switch c {
	case options.None:
		return "none"
	case options.Snappy:
		return "snappy"
	case options.ZSTD:
		return "zstd"
	}
	return fmt.Sprint(uint32(c))
}

// testLogger sends the store's warnings and errors (Badger's included) to
// the test log, where a failure's cause shows. The store must be closed
// before the test ends.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// filesSize is the total size of the files in dir whose names end in ext.
func filesSize(tb testing.TB, dir, ext string) int64 {
	tb.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+ext))
	if err != nil {
		tb.Fatal(err)
	}
	var n int64
	for _, f := range m {
		fi, err := os.Stat(f)
		if err != nil {
			tb.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// The integrity check finds a missing record, a payload with one byte
// changed and another offset's payload under a valid store checksum, and
// nothing else.
func TestIntegrity_FindsLostAndDamagedRecords(t *testing.T) {
	cfg := testConfig(t)
	cfg.Logger = testLogger(t)
	st := openStore(t, cfg)
	s := st.Stream("default")
	sh := newIntegrityShape(3000, cfg.Profile.spec())
	integrityWrite(t, s, sh, 1)

	var lost, flipped, moved uint64 = 10, 0, 0
	for off := uint64(20); moved == 0; off++ {
		if sh.size(off) < 12 || sh.size(off+1) < sh.size(off) {
			continue
		}
		if flipped == 0 {
			flipped = off
		} else if off > flipped+10 {
			moved = off
		}
	}
	flip := sh.payload(flipped)
	flip[len(flip)-1] ^= 0x10
	other := sh.payload(moved + 1)[:sh.size(moved)] // right length, wrong offset
	for _, off := range []uint64{lost, flipped, moved} {
		isolate(t, s, off) // its own entry, as key layout 2 stored every record
	}
	err := st.db.Update(func(txn *badger.Txn) error {
		if err := txn.Delete(recordKey(s.id, lost)); err != nil {
			return err
		}
		for off, p := range map[uint64][]byte{flipped: flip, moved: other} {
			r := &Record{Offset: off, Topic: sh.topic(off), Payload: p, QoS: 1}
			if err := txn.Set(recordKey(s.id, off), encodeRecord(nil, r)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s.tail.truncate(0) // read from Badger, as after a restart

	bad := integrityVerify(t, s, sh)
	if want := (badOffsets{{lost, lost}, {flipped, flipped}, {moved, moved}}); bad.String() != want.String() {
		t.Fatalf("integrity check found %v, want %v", bad, want)
	}
}
