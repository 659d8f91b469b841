// Package logstore is Peat's durable, Kafka-style offset log on Badger v4.
//
// A Store holds named streams in one Badger database. A stream captures the
// MQTT topics matching its filters (Store.Route picks the most specific
// filter) and is one append-only log with one offset sequence from 0.
// Offsets never repeat and never go backwards, across restarts and
// retention; Truncate (for replication followers) is the only way down.
//
// # Offsets
//
//	FirstOffset   log start: oldest offset retention still holds (persisted)
//	Committed     high watermark: readers see offsets below it
//	NextOffset    log end: offset of the next appended record
//
//	FirstOffset <= Committed <= NextOffset
//
// On a single node Committed follows NextOffset as soon as a group commit is
// durable. With Config.ManualCommit only SetCommitted moves it (the cluster
// sets it to the ISR's high watermark); after a restart it starts at
// FirstOffset until the cluster sets it again.
//
// # Key layout
//
// Every key starts with a one-byte tag; stream names map to small ids kept
// under meta keys, so keys stay short and a stream can be renamed only by
// config, never by rewriting data. Offsets are big-endian, so Badger's key
// order is offset order.
//
//	record             'r' <id:4> <offset:8>                 -> record value
//	chunk stats        's' <id:4> <chunk start offset:8>     -> chunk value
//	consumer state     't' <key>                             -> value (state.go)
//	meta, stream id    'x' 'n' <stream name>                 -> uint32 id (BE)
//	meta, log start    'x' 's' <id:4>                        -> uint64 offset (BE)
//	meta, key layout   'x' 'v'                               -> uint32 version (BE), 2
//
//	record key, 13 bytes:
//	+-----+----+----+----+----+----+----+----+----+----+----+----+----+
//	| 'r' |    stream id (BE)  |          offset (BE, 8 bytes)         |
//	+-----+----+----+----+----+----+----+----+----+----+----+----+----+
//	                           |<-- block: first 6 bytes -->|
//
// The first 11 bytes of a record key name a block of 65536 offsets
// (offset >> 16); retention gives space back with DropPrefix of whole blocks.
//
// Records sort before every other key. A commit writes its records at the
// end of the log and rewrites a chunk-stats key, retention rewrites the log
// start, consumers rewrite their state; with all of those after the records,
// a level-0 table (one flushed memtable, spanning its smallest to its
// largest key) overlaps only the last table of the level below, and a
// level-0 compaction rewrites that table instead of the whole level.
// layout.go has the history: Open moves the keys of a store written in
// layout 1 (tags 'c', 'k', 'm', in front of the records) in place.
//
// # Record value
//
//	+---------+----------------+-------------------------------------------+
//	| version | CRC-32C (BE)   | msgpack array                             |
//	| 1 byte  | 4 bytes        | [ts, topic, payload, flags, client id,    |
//	|  = 1    |                |  epoch, content type, payload format,     |
//	|         |                |  response topic, correlation data,        |
//	|         |                |  user properties]                         |
//	+---------+----------------+-------------------------------------------+
//
//	CRC-32C (Castagnoli) covers the record's 8-byte big-endian offset, the
//	version byte and the msgpack body: a value copied under another key fails
//	too. The array is standard msgpack (any msgpack library decodes it):
//	ts int (unix ms, broker clock), topic str, payload bin, flags uint
//	(QoS | retain<<2), client id str, epoch uint, content type str, payload
//	format uint or nil, response topic str, correlation data bin, user
//	properties as a flat array of strings [k0, v0, k1, v1, ...]. Trailing
//	empty fields are left out (a plain QoS 1 publish stores 5 fields), and a
//	decoder skips fields it does not know, so fields can be added at the end.
//
// Integers take their shortest msgpack form, except that negatives below -32
// are always int64; payload and correlation data are bin even when empty
// (bin8 of length 0, never nil). TestCodec_OnDiskFormatIsStable pins these
// bytes. The body is written and read with vmihailenco/msgpack's streaming
// Encoder and Decoder (no reflection; msgpack.go). Two of the library's
// defaults differ from the format above and are overridden there, and, since
// stored bytes are not trusted, every length and element count is checked
// against the bytes left before anything is read or allocated (the library
// allocates a declared bin length up front), and unknown fields are skipped
// at most 32 levels deep (the library's Skip recurses without a limit).
//
// The offset itself is not in the value: the key carries it.
//
// # Chunk stats
//
// Every 1024 offsets form a chunk whose stats are rewritten in the same
// transaction as the records that change them (their keys sort after every
// record, see Key layout):
//
//	+-------------+---------------+-----------------+-----------------+
//	| count u32   | bytes u64     | min ts i64 (ms) | max ts i64 (ms) |
//	+-------------+---------------+-----------------+-----------------+
//
// They cover the records of the chunk at or above the log start, and serve
// byte accounting (Bytes), retention (age uses max ts, size uses bytes) and
// OffsetForTime (a sparse time index: find the chunk, scan at most 1024
// records). A chunk's bytes count encoded keys and values. The stats of the
// first and last chunk are recomputed from the records on Open, so a crash
// during a truncation leaves nothing stale.
//
// # Appends and durability
//
// Each stream has one appender goroutine, the only writer of the stream.
// It takes the oldest waiting request and every append queued behind it
// (up to 4096 records, or 7.5% of the memtable in bytes), assigns offsets in
// queue order, writes them as one Badger transaction with the chunk stats
// (split into more when Badger's per-transaction limit would be exceeded),
// commits, and only then advances the log end and calls each request's done,
// in call order. Truncation and retention are requests in the same queue.
//
// Badger's SyncWrites is a database-wide option, and db.Sync() does not cover
// a memtable that was just rotated, so fsync durability cannot be had per
// transaction. The store therefore opens Badger with SyncWrites=true when
// any stream uses fsync durability: every commit is fsynced before it
// returns, and a stream configured "interval" in such a store gets fsync
// durability too (never less than asked). When every stream uses interval
// durability, SyncWrites is off, an append is acknowledged once it is
// written, and a store goroutine calls db.Sync() every SyncInterval (the
// smallest of the streams'); a crash may lose up to that interval, plus a
// memtable rotated in it. DetectConflicts is off: one writer per stream and
// disjoint keys between streams.
//
// # Retention
//
// Retention never blocks writers for long. ApplyRetention (run every
// RetentionInterval) advances the log start logically: whole chunks whose max
// timestamp is older than MaxAge, or whose bytes exceed what MaxBytes allows,
// go first; within the next chunk records are dropped one by one from the
// front (scanning at most 1024). The new start and that chunk's stats are
// persisted in one small transaction; Read refuses offsets below it at once.
// Only committed records are dropped. The space comes back later: the
// appender calls DropPrefix for every whole 65536-offset block below the log
// start, in one call, at most once per ReclaimInterval (1 minute) for the
// whole store, because DropPrefix stops every writer of the database while
// it runs (other streams' commits wait on a lock instead of failing with
// ErrBlockedWrites). Records of a partly retained block stay on disk, hidden,
// until the block is whole. Badger's TTL is not used: it hides keys but gives
// no space back.
//
// Records above the profile's value threshold (64 bytes for pi-zero: nearly
// all of them) live in Badger's value log, and the tables hold 12-byte
// pointers to them. DropPrefix does not shrink the value log: after a
// reclaim, value-log GC rewrites, one at a time, the files whose garbage
// reached a ratio (0.9 with one stream, whose files empty in order; 0.5 with
// several), which moves what is live in them and deletes them. GC finds
// those files by the garbage DropPrefix counted while reading the tables it
// dropped, but DropPrefix deletes a table lying wholly inside one prefix
// unread: reclaim.go plans the prefixes so that no table of value pointers
// is dropped that way (TestReclaim_GivesBackTheValueLogOfACutTable;
// TestRetention_DiskStaysBounded appends 12 times max_bytes and checks the
// directory stays within its bound).
//
// # Full disk
//
// Badger writes its WAL, value log and tables through sparse memory-mapped
// files; running out of space while writing one is a fault that kills the
// process, not an error (seen: SIGBUS in table.CreateTable on a full 40 MB
// tmpfs; TestStore_RealDiskFull reproduces the protected case). The appender therefore refuses appends with ErrNoSpace while
// the filesystem has less free space than a reserve (profile default, or
// Config.MinFreeBytes), checked at most every 100 ms. A commit that fails
// with ENOSPC anyway fails its appends with ErrNoSpace too. The first refusal
// is logged once, as is the recovery; appends work again when space returns,
// and nothing already stored is touched.
//
// # Record size
//
// Store.MaxRecordBytes is the largest encoded record an append accepts:
// ValueLogFileSize less 1 KiB on disk, the value threshold in memory (Badger
// has no value log there, and in-memory stores keep records up to 64 KiB
// in the tables). Larger records fail with ErrRecordTooLarge before
// reaching Badger, whose own error would dump the whole value.
//
// # Corruption
//
// Read verifies each value's checksum and decodes it into a new Record; a
// value that fails either is reported as a *CorruptError with the stream and
// offset (records before it are returned first), and counted in
// peat_log_corrupt_records_total. Badger itself panics on some damaged
// tables (a block trailer whose counts point outside the block); every read
// transaction goes through Store.view, which recovers that into an error
// matching ErrCorrupt (Read: a CorruptError at the offset reached), so a
// damaged table fails the reads that meet it, not the broker. A table that
// Open cannot load fails Open. Badger's compactions read tables in its own
// goroutines, where a panic cannot be recovered.
//
// # Storage profiles
//
// Profiles pi-zero, pi and server set Badger's memtables, level sizes,
// compression, caches and value-log file size (see profile.go and issue 2),
// and a Go memory limit (Profile.MemoryLimit) the caller applies. All three
// keep records in the value log (profile.go, recordsInValueLog). Badger's
// warnings and errors go to the store's slog.Logger.
//
// # Memory-mapped pages
//
// Badger reads and writes every data file through a memory map, so each
// page an append or a read touches stays in the process's RSS until the
// kernel wants it back. Past Config.MappedLimit of such pages (a profile
// default), a goroutine hands them back with madvise(MADV_PAGEOUT), which
// drops clean pages from the page cache and never writes dirty ones early
// (mapped.go).
package logstore
