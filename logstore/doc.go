// Package logstore is Peat's durable, Kafka-style offset log on Badger v4.
//
// A Store holds named streams in one Badger database. A stream captures the
// MQTT topics matching its filters (Store.Route picks the most specific
// filter) and is one append-only log with one offset sequence from 0.
// Offsets never repeat and never go backwards, across restarts and
// retention; Truncate (for replication followers) is the only way down,
// and ResetTo only moves them up.
//
// # Routing
//
// A topic goes to the stream with the most specific filter matching it,
// compared level by level from the left: a literal beats '+', '+' beats
// '#', and a filter ending at the topic's last level beats one going on
// with "/#" ("sensors/kitchen" beats "sensors/kitchen/#" for topic
// "sensors/kitchen"). Two streams may not share a filter, so the winner is
// unique. A topic no filter matches is captured by no stream. Filters
// follow MQTT (§4.7): '+' and '#' fill a whole level, '#' only the last;
// empty levels are levels; wildcards at the first level do not match a
// topic starting with '$'.
//
// filter.go holds Peat's one filter validator (ValidateFilter) and matcher
// (MatchFilter); route.go the Router, a trie that routes a topic with a
// few map lookups and no allocation. Router.Reach (Store.Reach) answers
// the front-end's question "which streams can a subscription to this
// filter receive from", exactly and from the filters alone: it routes a
// witness topic per stream filter and length both can match, and its doc
// comment proves that no other topic reaches another stream.
// topicindex.go holds two tries on MatchFilter's rules for the
// front-end: TopicSet (the topics a filter matches: retained messages)
// and FilterIndex (the filters a topic matches: live subscriptions).
// Every lookup here is linear in the topic's or filter's length. Shared
// subscriptions
// ($share/<name>/<filter>) are the front-end's business (mochi takes the
// prefix off); a stream cannot capture one (Config.Validate).
//
// # Streams at run time
//
// AddStream and RemoveStream change the streams while the store runs (a
// cluster controller adds streams and moves leaders). The streams, the
// name map and the routing trie form one immutable set behind an atomic
// pointer (streams_runtime.go): a change builds a new set, validated as
// Open validates its Config, and swaps it in, so Route, Stream and Reach
// never see half of a change, and an append is routed by the streams of one
// moment. Watch delivers StreamAdded and StreamRemoved events (after an
// Added for each stream already there) through a queue per watcher: the
// store never waits for a slow one.
//
// The Config given to Open stays the source of truth: nothing records a
// stream added at run time, and Open builds the streams its Config lists.
// A stored stream the Config no longer lists keeps its id and records,
// unread, and comes back with them when listed again (at Open or by
// AddStream): a line missing from a configuration (a typo) never deletes
// anything. Unlisted shows such streams. RemoveStream stops the appender
// (queued appends fail with ErrStreamRemoved), makes the stream
// unreadable, then deletes it as DeleteStream does.
//
// # Deleting a stream (delete.go)
//
// DeleteStream deletes a stored stream the store does not serve, and
// only such a one (ErrStreamListed): an operator's explicit command, never
// a side effect of a configuration. In order:
//
//  1. one transaction replaces the name's id key by a tombstone, a stream
//     id key under the name "\x00deleting/<id>" that no configuration can
//     have; from here on the name is free, and a stream of that name gets
//     a new id and starts empty at offset 0;
//  2. the records and chunk stats go by DropPrefix, at most purgeBlocks
//     (512) blocks of 65536 offsets a call, each block one prefix, or its
//     256 runs where a table of value pointers lies inside it (as
//     reclaimPrefixes splits them, so value-log GC counts their values as
//     garbage and the disk comes back); other streams' commits wait on
//     writeMu during each call and go on between them;
//  3. whatever is left under the id (epochs, the stream's consumer state)
//     goes in one more DropPrefix;
//  4. one transaction deletes the log start, watermark, incarnation and
//     the tombstone, so an id is never reused while keys under it remain;
//  5. value-log GC, at half garbage, gives the files back.
//
// A crash after 1 leaves the tombstone: Open finishes every deletion it
// finds (2 to 4) before it loads a stream, so no stream ever reads a
// deleted stream's keys as its own. An older Peat sees the tombstone as a
// stored stream nothing lists: it neither reads its keys nor reuses its id.
//
// A stream may carry an incarnation ('x' 'i' <id:4> -> uint64 BE;
// SetIncarnation): the cluster records there which creation of a stream
// of that name the records belong to, and ResetStream empties a served
// stream (RemoveStream, then AddStream with the same configuration) when
// they belong to a deleted one.
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
// durable, and is NextOffset after a restart. With Config.ManualCommit only
// SetHighWatermark moves it (the cluster sets it to the lowest log end in
// the ISR on a leader, to the leader's, capped at its own log end, on a
// follower). It is published at once (every record below it is already
// durable where it must be) and persisted ('x' 'h' <id>) lazily, within
// 200 ms and on Close: a write and fsync per move sat in every acks=all
// acknowledgement's path twice and split the group commits around it. So
// a crash may reopen it below what readers saw, never above; Read waits
// at such an offset (not out of range) until the cluster moves it on,
// which it does as soon as the replicas speak. With ManualCommit, Truncate refuses
// to go below it (ErrBelowHighWatermark); ResetTo starts an emptied log at
// an offset at or above NextOffset (a follower whose log end the leader no
// longer holds), with all three offsets there.
//
// # Key layout
//
// Every key starts with a one-byte tag; stream names map to small ids kept
// under meta keys, so keys stay short and a stream can be renamed only by
// config, never by rewriting data. Offsets are big-endian, so Badger's key
// order is offset order.
//
//	record batch       'r' <id:4> <last offset:8>            -> batch value
//	chunk stats        's' <id:4> <chunk start offset:8>     -> chunk value
//	consumer state     't' <key>                             -> value (state.go)
//	stream state       'v' <id:4> <key>                      -> value (stream_state.go)
//	key-value          'w' <key>                             -> value (kv.go: Raft log, stable store)
//	leader epoch       'u' <id:4> <epoch:4>                  -> uint64 first offset (BE) (epochs.go)
//	meta, stream id    'x' 'n' <stream name>                 -> uint32 id (BE)
//	meta, log start    'x' 's' <id:4>                        -> uint64 offset (BE)
//	meta, high wmark   'x' 'h' <id:4>                        -> uint64 offset (BE), ManualCommit only
//	meta, incarnation  'x' 'i' <id:4>                        -> uint64 (BE) (delete.go)
//	meta, tombstone    'x' 'n' "\x00deleting/" <id decimal>  -> uint32 id (BE), a deletion under way
//	meta, key layout   'x' 'v'                               -> uint32 version (BE), 4
//
//	record key, 13 bytes:
//	+-----+----+----+----+----+----+----+----+----+----+----+----+----+
//	| 'r' |    stream id (BE)  |  last offset (BE, 8 bytes)            |
//	+-----+----+----+----+----+----+----+----+----+----+----+----+----+
//	                           |<-- block: first 6 bytes -->|
//
// Records are stored in batches (key layout 3): one Badger entry holds the
// records of a run of offsets and is keyed by the record key of the run's
// last offset. The batches of a stream are contiguous, so the first key at
// or above recordKey(off) is the batch that holds off: a read seeks there,
// the log end is the last key + 1. A batch never crosses a 1024-offset
// chunk, hence never a block: the first 11 bytes of a record key name a
// block of 65536 offsets (offset >> 16) that holds every record of its
// batch, and retention gives space back with DropPrefix of whole blocks.
//
//	offsets   ... 1021 1022 1023 | 1024 1025 ... 1300 | 1301 ...
//	entries   ... ---- key 1023 -+---- key 1300 ------+--- ...
//	                chunk 0      |      chunk 1
//
// Records sort before every other key. A commit writes its records at the
// end of the log and rewrites a chunk-stats key, retention rewrites the log
// start, consumers rewrite their state; with all of those after the records,
// a level-0 table (one flushed memtable, spanning its smallest to its
// largest key) overlaps only the last table of the level below, and a
// level-0 compaction rewrites that table instead of the whole level.
// layout.go has the history: Open moves the keys of a store written in
// layout 1 (tags 'c', 'k', 'm', in front of the records) in place; a store
// of layout 2 (one entry per record, keyed by its offset) is already a
// store of batches of one, and only its version changes.
//
// A leader-epoch key is written in the transaction of the records that
// start its epoch (the first record whose epoch is above the newest
// cached), deleted by a truncation below its start (in the truncation's
// last transaction; Open deletes any a crash left at or above the log
// end), and read at Open, when the stream's epoch becomes the newest one
// (Stream.EndOffsetForEpoch answers KIP-101/KIP-279's question from it).
// Retention trims it as Kafka does (truncateFromStart), in the
// transaction that moves the log start: the epochs that ended below the
// start go, and the one the start falls in starts there, so an epoch the
// log no longer holds is answered as one below the cache.
//
// # Replication
//
// What a follower replica needs of its log (Kafka's rules, DESIGN.md):
//
//   - AppendReplica stores the leader's record values unchanged at the
//     leader's offsets, from NextOffset only (ErrNotAtLogEnd), after
//     checking each value's checksum at the offset it is to take.
//   - ReadRaw serves them on the leader, up to ShipEnd (not Committed),
//     as stored; WaitAppended and Appended wake a long-polled fetch when
//     the log end moves, Changed only when the high watermark does.
//   - Early shipping (ship.go): with ManualCommit a group commit is shown
//     to fetches (ShipEnd, ReadRaw) while it is being written, so the
//     followers' fsyncs overlap the leader's. The watermark still counts
//     only the leader's durable log end. A shipped commit that fails
//     leaves the stream refusing appends (ErrShippedUnwritten) until a new
//     leader epoch, so no offset names two records in one epoch.
//   - EndOffsetForEpoch answers from the persisted leader-epoch cache
//     where a follower truncates after a leader change (KIP-101/279).
//   - SetHighWatermark moves Committed (ManualCommit) and persists it
//     lazily; Truncate never goes below it; ResetTo starts a follower over
//     at the leader's log start.
//   - KVGet, KVWrite and KVScan keep the controller's Raft state.
//
// # Record value
//
// A batch value is either one record value (version 1: a batch of one,
// what key layout 2 stored for every record) or a batch of records:
//
//	+---------+---------+----------+----------------+-----+------------+------------------+
//	| version | count n | length 0 | record value 0 | ... | length n-1 | record value n-1 |
//	| 1 byte  | uvarint | uvarint  | (version 1)    |     | uvarint    | (version 1)      |
//	|  = 2    | 2..1024 |          |                |     |            |                  |
//	+---------+---------+----------+----------------+-----+------------+------------------+
//
//	Record i of a batch keyed by offset L holding n records has offset
//	L-n+1+i; all n lie in L's chunk. Each record value keeps its own
//	checksum over its own offset, so a truncation writes a batch's first
//	records back unchanged (and a lone one as its version-1 value), a read
//	from the middle checks only the records it returns, and a damaged record
//	costs that record alone. The framing has no checksum of its own: it
//	must hold exactly n lengths that end at the value's end, and a wrong
//	count or length fails the checksums of the records it shifts.
//
// The appender writes a commit's records as batches of at most 32 KiB
// (maxBatchValue: Badger's cost per entry is 0.15% of that, and a read
// from inside a batch walks it from the start; lower in memory, where the
// value threshold is Badger's limit) and never across a chunk; a commit of
// one record, or a record larger than the cap, is a batch of one (version
// 1), so the bytes of a lone record are those of key layout 2.
// TestCodec_BatchFormatIsStable pins them.
//
// A record value:
//
//	+---------+----------------+-------------------------------------------+
//	| version | CRC-32C (BE)   | msgpack array                             |
//	| 1 byte  | 4 bytes        | [ts, topic, payload, flags, client id,    |
//	|  = 1    |                |  epoch, content type, payload format,     |
//	|         |                |  response topic, correlation data,        |
//	|         |                |  user properties, message expiry]         |
//	+---------+----------------+-------------------------------------------+
//
//	CRC-32C (Castagnoli) covers the record's 8-byte big-endian offset, the
//	version byte and the msgpack body: a value copied under another key or
//	to another place in a batch fails too. The array is standard msgpack
//	(any msgpack library decodes it):
//	ts int (unix ms, broker clock), topic str, payload bin, flags uint
//	(QoS | retain<<2), client id str, epoch uint, content type str, payload
//	format uint or nil, response topic str, correlation data bin, user
//	properties as a flat array of strings [k0, v0, k1, v1, ...], message
//	expiry uint (seconds, at most 2^32-1; 0 or absent: never). Trailing
//	empty fields are left out (a plain QoS 1 publish stores 5 fields), and a
//	decoder skips fields it does not know, so fields can be added at the end.
//
// Message expiry was added last, as field 11: a record written before it
// has at most 11 fields and decodes with no expiry, a record without
// expiry is written byte for byte as before, and a record with one is
// framed and checksummed like any other (the CRC covers the whole body, so
// nothing about the checksum changes). An older Peat reading a newer
// record skips the field. It is stored as the MQTT 5 interval the producer
// sent, counted from the record's timestamp, not as an absolute deadline:
// the timestamp is the broker-clock time the appender stamps when it
// writes the record, so interval + timestamp is the deadline without a
// second clock reading that could disagree with it; the interval takes 1-5
// bytes where a unix-ms deadline takes 9; and the producer's own interval
// stays in the log for whoever forwards the record (Record.ExpiryLeft
// computes what is left). The interval starts when the record is stamped,
// a group commit after the broker received it: a message lives those few
// milliseconds longer, never shorter.
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
// The offset itself is not in the value: the key and the record's place in
// its batch carry it.
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
// records). They count records, not batches: a chunk's bytes give each
// record its own 13-byte key and its version-1 value, what it took as its
// own entry in key layout 2, whatever batch holds it. That is about 10
// bytes a record more than a batch stores (13 bytes of key for each record
// against one key per batch, less 2-3 bytes of framing), so Bytes never
// understates the disk, and retention by bytes keeps the same records it
// kept before batches. The stats of the first and last chunk are recomputed
// from the records on Open, so a crash during a truncation leaves nothing
// stale.
//
// # Appends and durability
//
// Each stream has one appender goroutine, the only writer of the stream.
// It takes the oldest waiting request and every append queued behind it
// (up to 4096 records, or 7.5% of the memtable in bytes), assigns offsets in
// queue order, encodes each record, cuts the run into batches (at every
// chunk boundary and at 32 KiB, see Record value; requests do not matter,
// one may span batches and a batch hold several), writes the batches as one
// Badger transaction with the chunk stats (split into more, between
// batches, when Badger's per-transaction limit would be exceeded), commits,
// and only then advances the log end and calls each request's done, in call
// order. Truncation, retention, replica appends, high-watermark writes and
// resets are requests in the same queue.
//
// Batches are what make the log cheap to write: with records above the
// value threshold, Badger writes each entry's value once to its value log
// and a ~45-byte pointer entry to its write-ahead log, a level-0 table and
// again at each compaction. With one entry per record that came to 400-415
// bytes written per 179-byte record (BenchmarkIngest, 1M records, fsync,
// ext4); with one per batch, 278 in every profile, most of the rest being
// the pages each fsynced commit writes again
// (scripts/bench-results/sd-card.md).
//
// Truncate(offset) deletes, from the top down, the batches that hold
// offsets at or above offset; the one that holds offset-1 and offset is cut:
// its records below offset are written back as a batch keyed by offset-1 in
// the transaction that deletes it, so a crash leaves a contiguous log. A
// batch whose framing is damaged cannot be cut: Truncate then fails with a
// CorruptError (at a chunk start, or right after the end of a batch, there
// is nothing to cut and its value is not read).
//
// Badger's SyncWrites is a database-wide option, and db.Sync() does not cover
// a memtable that was just rotated, so fsync durability cannot be had per
// transaction. The store therefore opens Badger with SyncWrites=true when
// any stream uses fsync durability: every commit is fsynced before it
// returns, and a stream configured "interval" in such a store gets fsync
// durability too (never less than asked). When every stream uses interval
// durability, SyncWrites is off, an append is acknowledged once it is
// written, and a store goroutine fsyncs every SyncInterval (the smallest of
// the streams') each value-log and memtable-log file written to since the
// previous sync (logSyncer: db.Sync() covers only the newest memtable log,
// and one Badger has just moved past waits for its table's flush);
// a power cut may lose up to that interval. Value-log GC's copies are
// synced before Badger deletes the file they came from. DetectConflicts is
// off: one writer per stream and disjoint keys between streams.
//
// The appender also keeps each stream's newest records in memory (tail.go:
// 2,048 records, at most 2 MiB), so a reader at the log's end is served
// without a Badger read.
//
// # Retention
//
// Retention never blocks writers for long. ApplyRetention (run every
// RetentionInterval) advances the log start logically: whole chunks whose max
// timestamp is older than MaxAge, or whose bytes exceed what MaxBytes allows,
// go first; within the next chunk records are dropped one by one from the
// front (scanning at most 1024). The new start and that chunk's stats are
// persisted in one small transaction; Read refuses offsets below it at once.
// Only committed records are dropped. A stream with MaxBytes does not wait
// for the loop: a commit that takes it a sixteenth past MaxBytes applies
// retention right after its appends are acknowledged (retainOnCommit), so
// a stream never grows by a RetentionInterval of ingest.
//
// The space comes back later, with DropPrefix, which stops every writer of
// the database while it runs (other streams' commits wait on a lock instead
// of failing with ErrBlockedWrites). A reclaim (reclaim.go) is due when
//
//   - a whole 65536-offset block lies below the log start: at most once per
//     ReclaimInterval (1 minute) for the whole store;
//   - or the bytes retention dropped since the last reclaim reach a quarter
//     of MaxBytes (a value-log file's worth for a stream kept by age only);
//   - or the store refuses appends for lack of space (see Full disk) and
//     retention dropped anything.
//
// The last two come at most every 250 ms per stream, and give back the
// partly dropped block too: each run of 256 offsets wholly below the log
// start as one 12-byte prefix, the batches of the run that holds it as
// their own keys. Large records never fill a block (16 KiB records: 1 GiB
// a block), so a reclaim by blocks alone never came and a small disk
// filled up for good (TestStore_SmallDiskKeepsAcceptingUnderRetention).
// The records of the batch that holds the log start stay on disk, hidden,
// until a later reclaim. Badger's TTL is not used: it hides keys but gives
// no space back.
//
// Batch values above the profile's value threshold (64 bytes: nearly all
// of them) live in Badger's value log, and the tables hold 12-byte
// pointers to them. DropPrefix does not shrink the value log: after each
// reclaim, value-log GC rewrites, one at a time, the files whose garbage
// reached a ratio (0.9 with one stream, whose files empty in order; 0.5 with
// several), which moves what is live in them and deletes them. GC never
// takes the file being written, and frees whole files only, which is why
// the profiles' value-log files are 16 MiB (pi-zero) and 32 MiB (pi,
// server): with 256 MiB files the server profile kept everything pushed
// through a 16 MiB stream (scripts/bench-results/disk.md). GC finds those
// files by the garbage DropPrefix counted while reading the tables it
// dropped, but DropPrefix deletes a table lying wholly inside one prefix
// unread: reclaim.go plans the prefixes so that no table of value pointers
// is dropped that way (a block, or a run, holding a table of its own is
// given back in smaller prefixes; a one-key table keeps its key;
// TestReclaim_GivesBackTheValueLogOfACutTable).
//
// What a store takes on disk under size retention is then bounded
// (Store.DiskBound): twice the sum of its streams' MaxBytes, plus the
// profile's overhead (Profile.DiskOverhead: two value-log files, the
// memtables' logs and 8 MiB; pi-zero 48 MiB, pi and server 80 MiB).
// Measured with 16 B to 1 MiB records, pushing 8 times a 16 MiB max_bytes:
// at most 2.6 times max_bytes (pi-zero) and 3.3 times (server) at the
// peak, against bounds of 5 and 10.5 times (scripts/bench-disk.sh).
// The price is writers stopped for a DropPrefix (7-120 ms measured) per
// quarter of MaxBytes and for a GC round (30-100 ms) per value-log file.
//
// # Full disk
//
// Badger writes its WAL, value log and tables through sparse memory-mapped
// files; running out of space while writing one is a fault that kills the
// process, not an error (seen: SIGBUS in table.CreateTable on a full 40 MB
// tmpfs; TestStore_RealDiskFull reproduces the protected case). The
// appender therefore refuses appends with ErrNoSpace while the filesystem
// has less free space than a reserve, checked at most every 100 ms.
// Config.MinFreeBytes sets the reserve; by default it is the profile's
// scaled to the filesystem (Profile.Reserve): a twentieth of it, at least
// two value-log files and two memtables (what Badger may write past a
// check), at most the profile's figure (pi-zero 64 MiB, pi 128 MiB, server
// 512 MiB). A fixed 512 MiB refused every publish on a 1 GB card. A
// commit that fails with ENOSPC anyway fails its appends with ErrNoSpace
// too. The first refusal is logged once, as is the recovery; a refused
// commit applies retention and reclaims what it dropped at once (at most
// every 250 ms), so appends work again as soon as retention has given back
// its share (TestStore_SmallDiskRefusingRecoversAsRetentionFrees), or when
// space returns, and nothing already stored is touched. A reclaim writes
// too (a memtable flush, a compaction, what GC moves), through the same
// memory maps: while appends are refused, none runs unless two memtables
// and an eighth of a value-log file are still free. While refusing, GC
// still frees only files that are nine tenths garbage (half with several
// streams): a file that retention emptied only in part is given back
// once appends resume and retention empties it. Store.Space
// reports free space, reserve and the refusing state; the metrics
// peat_disk_free_bytes, peat_disk_size_bytes, peat_disk_reserve_bytes and
// peat_disk_refusing show them.
//
// # Record size
//
// Store.MaxRecordBytes is the largest encoded record an append accepts:
// ValueLogFileSize less 1 KiB on disk (16 MiB pi-zero, 32 MiB pi and
// server), the value threshold in memory (Badger
// has no value log there, and in-memory stores keep records up to 64 KiB
// in the tables). Larger records fail with ErrRecordTooLarge before
// reaching Badger, whose own error would dump the whole value.
//
// # Corruption
//
// Read checks the framing of each batch it meets, then the checksum of each
// record it returns, and decodes it into a new Record; a record that fails
// is reported as a *CorruptError with the stream and its offset (records
// before it are returned first), as is a batch whose framing is bad or that
// does not start where the one before ended, at the first offset the read
// needed from it (the batch's first, or where the read started), and
// counted in peat_log_corrupt_records_total. A read that starts past a bad
// record of a batch returns the batch's later records. Badger itself panics
// on some damaged tables (a block trailer whose counts point outside the
// block); every read transaction goes through Store.view, which recovers
// that into an error matching ErrCorrupt (Read: a CorruptError at the
// offset reached), so a damaged table fails the reads that meet it, not the
// broker. A table that
// Open cannot load fails Open. Badger's compactions read tables in its own
// goroutines, where a panic cannot be recovered.
//
// # Storage profiles
//
// Profiles pi-zero, pi and server set Badger's memtables, level sizes,
// compression, caches and value-log file size (see profile.go),
// and a Go memory limit (Profile.MemoryLimit) the caller applies. All three
// keep records in the value log (profile.go, recordsInValueLog). Their
// memtables are small (pi-zero 4 MiB, pi and server 2 MiB, with 1 MiB
// base tables) so that the heap a store holds stays an arena of a few MB
// however many records pile up, and Badger's pooled table builders stay
// small, which keeps a broker's RSS flat through an upstream outage
// (profile.go, flatRSS, with the measurements).
// Badger's warnings and errors go to the store's slog.Logger.
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
