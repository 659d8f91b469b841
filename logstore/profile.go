package logstore

import (
	"fmt"
	"math/bits"
	"runtime"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// Profile is a named set of Badger options sized for a class of machine.
type Profile string

// Storage profiles.
const (
	ProfilePiZero Profile = "pi-zero"
	ProfilePi     Profile = "pi"
	ProfileServer Profile = "server"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

// profileSpec starts from the project's first table of Badger settings per
// board class, then measured (below).
//
// pi-zero keeps the table's 128 MiB Go memory limit, measured against lower
// ones with 1,000 sensors publishing QoS 1 at 1 msg/s (peat-bench sensors,
// 25 s, broker on one x86 core, one run each, 2026-12-03; the command is in
// scripts/bench-results/memory.md). mochi gives each client two goroutines;
// since the MQTT front-end takes publishes before mochi's publish handling
// (mqtt/doc.go), their stacks stay at 16 + 4 KiB, and GOGC counts stacks,
// so the heap goal sits about 27 MB above the live heap: 71 MB RSS with 128
// MiB, the same with 64 MiB (the limit is not reached), 56 MB with 48 MiB
// at 4% more CPU per message and a PUBACK p99 of 8 ms instead of 6. A 1M-
// record ingest does not reach 48 MiB (peak RssAnon 16 MB, below). But a
// limit is a cliff: twice the sensors hold 40 MB of stacks alone, and at
// the limit the GC runs without pause, up to half the CPU of a one-core
// board; GOGC=50 (63 MB, the same CPU) has no cliff but is not the table's
// either. Before the front-end's change the stacks were 32 + 8 KiB: 100-135
// MB with 128 MiB, and 64 MiB cost +35% CPU per message and a PUBACK p99
// of 85 ms, as each GC shrank the idle read stacks and the next publish
// regrew them.
//
// pi-zero's memtables and base tables are 4 MiB, half the table's 8. Once
// records went to the value log and mapped pages were handed back
// (mapped.go), a 1M-record ingest's RSS was mostly Go heap, and its live
// part two memtable arenas and a table builder's 2x BaseTableSize buffer:
// peak RSS 110-122 MB (RssAnon 92-102) with 8 MiB, 68-73 MB (52-57) with
// 4 MiB, VmHWM 113-124 against 78-81 MB, at the same 55-58k acks/s and
// the same bytes written (2 runs each, PROFILES=pi-zero CLIENTS=0
// scripts/bench-pi.sh, 2026-12-02). The same run at 97792c5 (record
// batches since): peak RSS 33.5 MB, RssAnon 16 MB, 74-79k acks/s (2 runs,
// 2026-12-03; with GOMEMLIMIT=48MiB 33.1 MB, with GOGC=50 29.2 MB). Before,
// with records in the tables, 4 and 2 MiB memtables had lowered RSS in
// neither workload.
type profileSpec struct {
	memTableSize, baseTableSize, baseLevelSize int64
	numMemtables, l0Tables, l0Stall            int
	compression                                options.CompressionType
	blockCache, indexCache                     int64
	valueThreshold, valueLogFileSize           int64
	memoryLimit                                int64
	numCompactors                              int
	minFree                                    int64 // the most the default free-space reserve grows to (Profile.Reserve)
	mappedLimit                                int64 // default Config.MappedLimit; 0: never trim
	tableSizeMultiplier                        int   // 0: Badger's default (2)
}

var profiles = map[Profile]profileSpec{
	ProfilePiZero: {
		memTableSize: 4 * mib, numMemtables: 2, l0Tables: 2, l0Stall: 4,
		baseTableSize: 4 * mib, baseLevelSize: 32 * mib,
		compression: options.None, blockCache: 0, indexCache: 8 * mib,
		valueThreshold: recordsInValueLog, valueLogFileSize: 16 * mib,
		memoryLimit: 128 * mib, numCompactors: 2, minFree: 64 * mib, mappedLimit: 8 * mib,
	},
	ProfilePi: { // compression and caches: see serverReplay; memtables, tables, compactors and mapped pages: see flatRSS
		memTableSize: 2 * mib, numMemtables: 2, l0Tables: 3, l0Stall: 8,
		baseTableSize: 1 * mib, baseLevelSize: 64 * mib,
		compression: options.None, blockCache: 0, indexCache: 16 * mib,
		valueThreshold: recordsInValueLog, valueLogFileSize: 32 * mib,
		memoryLimit: 256 * mib, numCompactors: 2, minFree: 128 * mib, mappedLimit: 4 * mib,
	},
	ProfileServer: { // compression and caches: see serverReplay; memtables, tables, compactors and mapped pages: see flatRSS
		memTableSize: 2 * mib, numMemtables: 2, l0Tables: 5, l0Stall: 15,
		baseTableSize: 1 * mib, baseLevelSize: 64 * mib,
		compression: options.None, blockCache: 0, indexCache: 64 * mib,
		valueThreshold: recordsInValueLog, valueLogFileSize: 32 * mib,
		memoryLimit: 0, numCompactors: 2, minFree: 512 * mib, mappedLimit: 4 * mib,
	},
}

// Value-log files are 16 MiB (pi-zero) and 32 MiB (pi, server; they were
// 32, 64 and 256). Value-log GC frees whole files and never the one being
// written, so a store under size retention holds up to two files more
// than it retains (Profile.DiskOverhead), and with 256 MiB files a server
// stream of max_bytes 16 MiB kept all 131 MiB pushed through it. After
// the change, pushing 8 times a 16 MiB max_bytes with 16 B to 1 MiB
// records peaked at 32-42 MiB on disk (pi-zero) and 47-53 MiB (server)
// (scripts/bench-disk.sh, scripts/bench-results/disk.md). The largest
// record shrinks with the file (Store.MaxRecordBytes: 16 MiB less 1 KiB
// for pi-zero), still well above MQTT's default 1 MiB max payload.

// recordsInValueLog is every profile's value threshold: values of more bytes
// (every record with a payload of more than about 20 bytes) are written once
// to Badger's value log, and the tables hold a 12-byte pointer to each. A
// record inline in the tables is written again by each compaction that
// moves it down a level. 1,000,000 records of 128-byte payloads, written
// per record (2026-12-02, ext4 on a loop device, a shared 2-core VM):
//
//	                          inline           value log
//	bench-pi.sh, MQTT QoS 1   pi-zero   912    409-415
//	(payloads of zeros)       pi        359    370-372
//	                          server    310    346-356
//	BenchmarkIngest, random   pi-zero  1393*   406
//	payloads                  pi        626*   372
//	                          server    396*   346
//	(* key layout 1)
//
// Snappy only helps inline records that compress; reads from the value log
// were as fast (BenchmarkReadFrom, BenchmarkReadAll). The price: with fsync
// durability a commit fsyncs the value-log file as well as the write-ahead
// log (pi's 1M-record ingest: 28.7k acks/s inline, 21.7k in the value log,
// same hour), the value log is not compressed (the disk holds 214-232 bytes
// per record instead of 44 when payloads compress 4x), and only value-log
// GC gives its space back (reclaim.go, Store.valueLogGC). Where commits
// hold a record or two (1,000 sensors at 1 msg/s, fsync) the extra fsynced
// page outweighs what compactions save in a short run: pi-zero 4,536 inline
// against 6,453 bytes per message with linger 0, 871 against 1,517 with
// linger 5ms (30 s, bench-pi.sh; scripts/bench-results/sd-card.md).
const recordsInValueLog = 64

// serverReplay: the server profile's memtables, compression and caches
// are sized for replay, a log read mostly once, in order (the target: broker
// RSS during a 1M-record replay within 50 MB of idle). It had Snappy, a
// 256 MiB block cache and a 128 MiB index cache: Badger's iterators fill
// the block cache on every read (table.NOCACHE is not reachable from
// IteratorOptions), and a replay grew anonymous memory by 441-498 MB. With
// records in the value log the tables hold pointers, about 35 MB per million
// records, so the caches could not fill, yet the growth was still 138-161
// MB: Go's heap goal counts the 64 MiB memtable arena as live, so garbage
// piled up to about twice that before a GC. Now: no compression (it only
// shrank the pointer tables), so no block cache (Badger requires one with
// compression; the tables are read through their memory map), a 64 MiB
// index cache (0 would keep every table's index in the heap for good), and
// 16 MiB memtables (2 MiB since: flatRSS). PROFILES=server REPS=3
// MOSQUITTO=0 scripts/bench-replay.sh (2026-12-02, 2-core VM, load 3-6),
// before -> after: QoS 0 250k -> 287k
// msg/s (medians; 146-341k and 255-465k), 3.3 -> 3.1 us of broker CPU per
// message, anonymous growth +138 -> +24 MB; QoS 1 107k -> 118k msg/s,
// +161 -> +26 MB. File-backed growth, the pages of the value log and
// tables the replay read, went +210 -> +226 MB: page cache, which the
// kernel reclaims, but VmRSS counts it. The live tail of each stream is
// served from logstore's own tail cache, without Badger.
//
// The pi profile dropped Snappy and its 16 MiB block cache for the same
// reason, once mapped pages were handed back (mapped.go) and growth was
// mostly heap. scripts/bench-replay.sh and scripts/bench-pi.sh on one quiet
// 2-core VM (2026-12-03, one run each), Snappy -> none: 1M-record replay,
// QoS 0, 580k -> 558k msg/s and RSS +78 -> +46 MB over idle (anonymous 56
// -> 24); QoS 1 213k msg/s, +41 MB; 1M-record fsync ingest 34.7k -> 43.6k
// acks/s, 443 -> 401 bytes written per record, peak RSS 196 -> 119 MB.

// flatRSS: the pi and server profiles' memtables, tables, compactors and
// mapped-page limit are sized so that a broker's RSS does not climb while
// records pile up (an upstream outage of 1M records and more).
// With 16 MiB memtables (4 server, 3 pi), 8 MiB base tables, 4 server
// compactors and a 16 MiB mapped limit, a server broker taking 1M QoS 1
// records (10 publishers, 64-byte payloads, no subscriber, no sink) went
// 50.4 -> 63.4 MB RSS over 8 parts, and 2M-4M records reached 90-110 MB.
// What grew (runtime metrics beside /proc/self/smaps, 2026-12-04):
//
//   - The Go heap, 31.6 -> 38.4 MB anonymous, while HeapSys less released
//     stayed at 48 MB: the live heap is one memtable arena (Badger allocates
//     MemTableSize x 1.3 as one []byte: 21 MB) plus 3 MB, GOGC 100 lets the
//     heap grow to twice that, and Go touches the pages of that 48 MB one
//     after another as garbage lands on new ones. It stops only when all are
//     touched, and jumps when a second arena (a memtable waiting for its
//     flush) or compaction's table builders (up to 8 in flight, each 2x the
//     table size) are live at a collection: 2 arenas are 42 MB, and goal 85.
//   - Mapped pages of the value log and write-ahead log, 18.8 -> 25 MB:
//     trimmed back to the binary's 17-19 MB each time they pass 16 MiB.
//
// Then: 4 MiB memtables (2), 4 MiB base tables, 2 compactors (Badger's
// least), 4 MiB of mapped pages. The live heap a store holds is 6 MB
// above an empty process, however many records it took
// (TestProfile_LiveHeapStaysSmallAsRecordsPileUp: 21.8 MB before), and
// RSS through 3M records rested at 35-41 MB (scripts/bench-results/
// sink.md, 2026-12-04 15:58), but rose 10-20 MB during compactions: in
// 1M-record pile-ups with a sink attached the RSS after each quarter
// spread over 11-20 MB (3 runs, peaks 53-61 MB). What rose is Badger's
// table builders: each takes an allocator of 2x the table size from a
// pool that keeps up to 8 (ristretto's AllocatorPool) and frees one only
// after 2 s with no Get; a compaction writes several tables at once, and
// the memtable flushes that follow every second or so keep the pool's
// allocators live until the pile-up ends, the GC goal at twice them.
//
// Now: 2 MiB memtables and 1 MiB base tables, so an allocator is 2 MiB
// and a memtable arena 2.6 MB. The same pile-up's quarters spread over
// 2.3-3.4 MB, peak 39-41 MB (3 runs; 2026-12-04 21:40-21:49,
// scripts/bench-results/sink.md). Through 3M records (no sink) the
// twelfths spread over 9 MB, peak 43-47: deeper compactions hold more
// builders at once (a table size multiplier of 1 did not change that). Ingest (fsync, 10 QoS 1 publishers)
// and replay (scripts/bench-replay.sh, server) were no slower, within the
// noise of a machine shared with test runs. Tables are 4 times as many
// (deeper levels still double, TableSizeMultiplier), and one group commit
// holds at most 157 KB of records (7.5% of the memtable, store.go): above
// about 2,000 records of 77 bytes, a burst takes more commits, each
// fsynced. pi-zero keeps 4 MiB: not measured on this workload.
//
// GOGC=50 halves the rest of the swing (1M pile-up, sink attached: spread
// 0.9-1.9 MB, peak 36-37 MB) at about 5% more CPU per message at full
// QoS 1 rate: an operator's choice, not a default. Pinning the heap does
// not flatten it: GOGC=off with GOMEMLIMIT=48MiB swung between 27 and 42
// MB of anonymous memory, as the limit makes the scavenger give pages
// back after every collection.

// DefaultProfile is pi on arm and arm64, server elsewhere.
func DefaultProfile() Profile {
	switch runtime.GOARCH {
	case "arm", "arm64":
		return ProfilePi
	}
	return ProfileServer
}

// Validate accepts the known profiles and "" (the default).
func (p Profile) Validate() error {
	if p == "" {
		return nil
	}
	if _, ok := profiles[p]; !ok {
		return fmt.Errorf("unknown storage profile %q, want %q, %q or %q", string(p), ProfilePiZero, ProfilePi, ProfileServer)
	}
	return nil
}

// MemoryLimit is the Go memory limit (for debug.SetMemoryLimit) that suits
// the profile, in bytes; 0 means none.
func (p Profile) MemoryLimit() int64 { return p.spec().memoryLimit }

func (p Profile) orDefault() Profile {
	if p == "" {
		return DefaultProfile()
	}
	return p
}

func (p Profile) spec() profileSpec {
	s, ok := profiles[p.orDefault()]
	if !ok {
		s = profiles[ProfileServer]
	}
	if bits.UintSize == 32 {
		s = s.for32Bit()
	}
	return s
}

// for32Bit narrows s to what Badger v4.9.6 keeps intact on a 32-bit
// platform (armv6, armv7), whichever profile was chosen.
//
// Badger builds every table in a ristretto z.Allocator taken from a pool.
// When the allocator's first buffer is full it adds a second one and
// stores uint64((bufIdx+1)<<32) as its position (ristretto v2.2.0,
// z/allocator.go:290): with a 32-bit int the shift is 0, so the table's
// later blocks are written over its first ones. The result is lost offset
// ranges or "slice bounds out of range" panics when the table is read.
// The first buffer holds 2x the TableSize of the builder that created the
// allocator, and pooled allocators are reused for any table, so every table
// must fit in 2x the smallest TableSize:
//
//   - no compression: a compressed table is cut by its compressed size
//     while the uncompressed blocks are allocated too;
//   - BaseTableSize >= MemTableSize: a memtable flush is one table built
//     with TableSize = BaseTableSize;
//   - TableSizeMultiplier 1: deeper levels would get 2x, 4x ... tables
//     from allocators made for the base level;
//   - a value threshold well under the 4 KiB block size: a larger inline
//     value makes its block grow twice (for the value, then for the block
//     trailer), three times the value in allocator space.
//
// TestStore_IntegrityAfterReopen with 1,000,000 records under qemu-arm
// (2026-12-02): the pi profile as on 64-bit panicked in table.block; these
// options with a 64 KiB value threshold failed 3 runs of 3 (40,046 offsets
// silently lost, a panic, a GC "bad pointer" crash); these options passed
// 10 of 10 on armv7 and armv6 (pi and pi-zero), and once with 3,000,000.
//
// The value log file is at most 64 MiB and the memtable 16 MiB: Badger
// maps the writable value log at twice its size (the default file would
// ask for 2 GiB), and a 32-bit process has 3-4 GiB of address space for
// everything. Badger maps every table and value log file whole: under
// qemu-arm appends failed with ENOMEM at 2.4 GB of data, so retention
// (max_bytes) must keep a 32-bit store well below that. The block cache
// only serves compressed blocks: none.
func (s profileSpec) for32Bit() profileSpec {
	s.compression = options.None
	s.blockCache = 0
	s.memTableSize = min(s.memTableSize, 16*mib)
	s.baseTableSize = max(s.baseTableSize, s.memTableSize)
	s.tableSizeMultiplier = 1
	s.valueThreshold = min(s.valueThreshold, valueThreshold32)
	s.valueLogFileSize = min(s.valueLogFileSize, 64*mib)
	return s
}

// valueThreshold32 is the largest value kept inline in the tables on 32-bit
// platforms; larger ones go to the value log.
const valueThreshold32 = 1 * kib

// inMemory adapts s to Badger's in-memory mode (tests), which has no value
// log and refuses values above the value threshold: records up to 64 KiB
// (1 KiB on 32-bit platforms, see for32Bit) stay in the tables.
func (s profileSpec) inMemory() profileSpec {
	limit := int64(64 * kib)
	if bits.UintSize == 32 {
		limit = valueThreshold32
	}
	s.valueThreshold = max(s.valueThreshold, limit)
	return s
}

// badgerOptions builds the Badger options for the profile. The caller sets
// Dir/InMemory, SyncWrites and Logger.
func (p Profile) badgerOptions() badger.Options { return p.spec().badgerOptions() }

func (s profileSpec) badgerOptions() badger.Options {
	o := badger.DefaultOptions("")
	if s.tableSizeMultiplier > 0 {
		o.TableSizeMultiplier = s.tableSizeMultiplier // no With method
	}
	return o.
		WithMemTableSize(s.memTableSize).
		WithNumMemtables(s.numMemtables).
		WithNumLevelZeroTables(s.l0Tables).
		WithNumLevelZeroTablesStall(s.l0Stall).
		WithBaseTableSize(s.baseTableSize).
		WithBaseLevelSize(s.baseLevelSize).
		WithCompression(s.compression).
		WithBlockCacheSize(s.blockCache).
		WithIndexCacheSize(s.indexCache).
		WithValueThreshold(s.valueThreshold).
		WithValueLogFileSize(s.valueLogFileSize).
		WithNumCompactors(s.numCompactors).
		WithNumVersionsToKeep(1).
		WithDetectConflicts(false).
		WithMetricsEnabled(false).
		WithLoggingLevel(badger.WARNING)
}
