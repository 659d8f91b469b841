package logstore

import (
	"path/filepath"
	"time"
)

// Badger reads and writes every data file through a shared memory map: the
// write-ahead log (.mem), the value log (.vlog) and the tables (.sst). Each
// page the broker touches there stays in its RSS until the kernel needs the
// memory back: a 1,000,000-record ingest left 190 MB of such pages in the
// pi-zero broker's RSS beside 85 MB of heap, and a replay as much again.
// They are page cache, clean once fsynced, and the kernel reclaims them
// under pressure; but a board's memory budget (a systemd MemoryMax, the
// OOM killer's choice, a user watching top) counts them.
//
// The trimmer keeps that part of RSS bounded: when the process's
// file-backed RSS has grown by more than the limit, it asks the kernel
// (madvise MADV_PAGEOUT, Linux 5.4) to reclaim the pages of the store's
// mappings. Clean pages leave the page cache, so what is read again later
// comes from the disk; dirty pages are not written early, only unmapped
// (write_bytes, the SD card's wear, does not change). MADV_PAGEOUT is a
// hint that never changes memory contents, which matters: the mappings are
// Badger's, found in /proc/self/maps, and one may be unmapped, and its
// addresses reused, between reading the list and the madvise call.
//
// The profiles' limits were pi-zero 8 MiB, pi and server 16 MiB, measured
// 2026-12-02 on the 2-core VM (quiet), 1M records of 128 bytes:
//
//	                         limit off        64 MiB          16 MiB
//	server, QoS 0 replay     645k msg/s       602k            589k
//	  RSS growth (anon/file) +250 (24/226)    +90 (24/66)     +46 (24/22) MB
//	server, QoS 1 replay     228k msg/s                       208k
//	  RSS growth             +252 MB                          +40 MB
//	pi-zero (8 MiB), ingest  325 MB peak RSS  118 MB (56k against 66k acks/s, one run each)
//
// (PROFILES=server REPS=2 MOSQUITTO=0 MAPPED_LIMIT=... scripts/bench-replay.sh;
// PROFILES=pi-zero CLIENTS=0 scripts/bench-pi.sh.) The replay pays for
// reading from the disk what the page cache would have held: about 9%.
//
// pi and server are at 4 MiB (profile.go, flatRSS): these
// pages rise by the limit between trims, which showed as 6 MB of RSS
// growth through a 1M-record pile-up. BenchmarkReadAll, which reads from
// disk through the trimmer, 16 -> 4 MiB, 3 alternating runs on a loaded
// machine (load 7-9, 2026-12-04): server 0.97x, pi 0.95x (medians), within
// the noise of those runs.

// DefaultMappedCheck is how often the trimmer looks at file-backed RSS.
const DefaultMappedCheck = 100 * time.Millisecond

// mappedTrimmer bounds the store's share of file-backed RSS.
type mappedTrimmer struct {
	dir   string // absolute, symlinks resolved: as /proc/self/maps shows it
	limit int64  // bytes of file-backed RSS above base before a trim
	base  int64  // file-backed RSS when the store opened (the binary, libraries)
	next  int64  // trim when file-backed RSS passes this

	// rss and pageOut are the platform's (mapped_linux.go); tests replace them.
	rss     func() (int64, error)
	pageOut func(dir string) (int, error)
}

func newMappedTrimmer(dir string, limit int64) (*mappedTrimmer, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	t := &mappedTrimmer{dir: abs, limit: limit, rss: fileRSS, pageOut: pageOutMappings}
	if t.base, err = t.rss(); err != nil {
		return nil, err
	}
	t.next = t.base + limit
	return t, nil
}

// check trims if file-backed RSS has passed its bound, and reports how many
// mappings it trimmed (0: no trim). After a trim the bound is the lower of
// base+limit and what was left plus half the limit (dirty pages stay until
// they are written back), so a trim that could not reclaim is not repeated
// at every check.
func (t *mappedTrimmer) check() (int, error) {
	rss, err := t.rss()
	if err != nil || rss <= t.next {
		return 0, err
	}
	n, err := t.pageOut(t.dir)
	if err != nil {
		return n, err
	}
	left, err := t.rss()
	if err != nil {
		return n, err
	}
	t.next = max(t.base+t.limit, left+t.limit/2)
	return n, nil
}

// mappedLoop runs the trimmer until the store closes. An error (a kernel
// without MADV_PAGEOUT) is logged once and stops it.
func (st *Store) mappedLoop(t *mappedTrimmer) {
	defer st.wg.Done()
	tick := time.NewTicker(DefaultMappedCheck)
	defer tick.Stop()
	for {
		select {
		case <-st.stopping:
			return
		case <-tick.C:
		}
		n, err := t.check()
		if err != nil {
			st.log.Warn("logstore: cannot hand mapped pages back to the kernel; RSS will count the page cache Badger touched", attrDir, t.dir, attrErr, err)
			return
		}
		if n > 0 {
			st.metrics.MappedTrims.Inc()
		}
	}
}
