package logstore

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// mappedRSS sums the resident pages of the shared mappings of files in dir
// (the Rss lines of /proc/self/smaps), in bytes.
func mappedRSS(tb testing.TB, dir string) int64 {
	tb.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var total int64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if first, _, _ := strings.Cut(line, " "); !strings.HasSuffix(first, ":") { // a mapping's header line
			_, path, ok := parseMapsLine(line)
			in = ok && strings.HasPrefix(path, dir+"/")
			continue
		}
		if rest, ok := strings.CutPrefix(line, "Rss:"); ok && in {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				tb.Fatalf("smaps %q: %v", line, err)
			}
			total += kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return total
}

// The pages Badger's maps hold are handed back to the kernel, and what is
// read after that, from the disk, is intact, including while appends, reads
// and trims run at the same time.
func TestMapped_PageOutGivesPagesBackAndKeepsData(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "integrity", Filters: []string{"#"}})
	cfg.MappedLimit = -1 // this test trims by hand
	st := openStore(t, cfg)
	s := st.Stream("integrity")
	shape := newIntegrityShape(100_000, cfg.Profile.spec())
	tr, err := newMappedTrimmer(cfg.Dir, 1)
	if err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var trims int
	wg.Go(func() { // trims all through the write and the first read
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if _, err := tr.pageOut(tr.dir); err != nil {
				t.Errorf("pageOut: %v", err)
				return
			}
			trims++
		}
	})
	integrityWrite(t, s, shape, 7)
	bad := integrityVerify(t, s, shape)
	close(stop)
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("with trims running: %d offsets lost or corrupt: %s", bad.count(), bad)
	}
	t.Logf("%d trims during the write and the read", trims)

	integrityVerify(t, s, shape) // maps every page again
	before := mappedRSS(t, tr.dir)
	n, err := tr.pageOut(tr.dir)
	if err != nil {
		t.Fatal(err)
	}
	after := mappedRSS(t, tr.dir)
	t.Logf("%d mappings; their resident pages %d -> %d KiB", n, before>>10, after>>10)
	if n == 0 || before < 8*mib {
		t.Fatalf("%d mappings in %s holding %d KiB after a full read: the test reads too little to show anything", n, tr.dir, before>>10)
	}
	if after > before/10 {
		t.Errorf("after the trim the store's mappings hold %d of %d KiB, want at most a tenth", after>>10, before>>10)
	}
	if bad := integrityVerify(t, s, shape); len(bad) > 0 {
		t.Fatalf("after the trim: %d offsets lost or corrupt: %s", bad.count(), bad)
	}
}

// A store with a mapped limit keeps its mappings' resident pages near it
// on its own.
func TestMapped_StoreTrimsPastItsLimit(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "integrity", Filters: []string{"#"}})
	cfg.MappedLimit = 2 * mib
	st := openStore(t, cfg)
	s := st.Stream("integrity")
	shape := newIntegrityShape(60_000, cfg.Profile.spec())
	integrityWrite(t, s, shape, 11)
	deadline := time.Now().Add(20 * time.Second)
	for counterValue(t, st.metrics.MappedTrims) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no trim in 20 s after writing %d records; the store's mappings hold %d KiB", shape.n, mappedRSS(t, cfg.Dir)>>10)
		}
		integrityVerify(t, s, shape)
		time.Sleep(2 * DefaultMappedCheck)
	}
}

// A trim that leaves pages behind (dirty ones stay until written back)
// moves the bound up by half the limit instead of trimming at every check,
// and the bound comes back down to base+limit once a trim reclaims.
func TestMapped_CheckBoundsItsOwnTrims(t *testing.T) {
	var rss int64
	var left []int64 // what each trim leaves
	trims := 0
	tr := &mappedTrimmer{base: 10 * mib, limit: 8 * mib, next: 18 * mib,
		rss: func() (int64, error) { return rss, nil },
		pageOut: func(string) (int, error) {
			trims++
			rss, left = left[0], left[1:]
			return 3, nil
		},
	}
	step := func(now int64, wantTrims int) {
		t.Helper()
		rss = now
		if _, err := tr.check(); err != nil {
			t.Fatal(err)
		}
		if trims != wantTrims {
			t.Fatalf("at %d MiB: %d trims, want %d (next %d MiB)", now>>20, trims, wantTrims, tr.next>>20)
		}
	}
	left = []int64{17 * mib, 11 * mib}
	step(15*mib, 0) // below base+limit
	step(19*mib, 1) // leaves 17: next is 17+4 = 21
	step(20*mib, 1)
	step(22*mib, 2) // leaves 11: next is back at 18
	step(17*mib, 2)
	if tr.next != 18*mib {
		t.Fatalf("next %d MiB, want 18", tr.next>>20)
	}
}

func TestParseMapsLine(t *testing.T) {
	for _, c := range []struct {
		line       string
		start, end uintptr
		path       string
		ok         bool
	}{
		{"7f2c4000-7f2c6000 rw-s 00000000 fd:01 1234                       /data/000001.vlog", 0x7f2c4000, 0x7f2c6000, "/data/000001.vlog", true},
		{"7f2c4000-7f2c5000 r--s 00000000 fd:01 99 /data/with space/000002.sst (deleted)", 0x7f2c4000, 0x7f2c5000, "/data/with space/000002.sst", true},
		{"00400000-00600000 r-xp 00000000 fd:01 77                                 /usr/bin/peat", 0, 0, "", false}, // private
		{"7ffd1000-7ffd3000 rw-s 00000000 00:00 0                                  [anon_shared]", 0, 0, "", false},
		{"c000000000-c004000000 rw-p 00000000 00:00 0 ", 0, 0, "", false},
		{"garbage", 0, 0, "", false},
	} {
		m, path, ok := parseMapsLine(c.line)
		if ok != c.ok || path != c.path || m.start != c.start || m.end != c.end {
			t.Errorf("parseMapsLine(%q) = %#x-%#x %q %v, want %#x-%#x %q %v", c.line, m.start, m.end, path, ok, c.start, c.end, c.path, c.ok)
		}
	}
}
