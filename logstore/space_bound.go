package logstore

// DiskBound is the most disk the store should take under size retention:
// twice the sum of the streams' max_bytes, and a fixed overhead for the
// profile (DiskOverhead). It means nothing when a stream has no max_bytes.
//
// What makes the factor: a stream grows up to a sixteenth past max_bytes
// before a commit applies retention (retainOnCommit), what retention drops
// stays on disk until it reaches a quarter of max_bytes (maybeReclaim),
// and with several streams value-log GC rewrites a file once half of it is
// garbage (gcRatio).
func (st *Store) DiskBound() int64 {
	var sum int64
	for _, s := range st.Streams() {
		sum += s.cfg.MaxBytes
	}
	return 2*sum + st.overhead
}

// DiskOverhead is what a store of profile p takes on disk beyond its
// records: the value-log file being written and one not yet all garbage
// (GC frees whole files, never the one being written), the memtables'
// write-ahead logs, and 8 MiB for the tables of value pointers and
// Badger's own files. pi-zero 48 MiB, pi and server 80 MiB.
func (p Profile) DiskOverhead() int64 { return p.spec().diskOverhead() }

func (s profileSpec) diskOverhead() int64 {
	return 2*s.valueLogFileSize + int64(s.numMemtables)*s.memTableSize + 8*mib
}
