package logstore

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// spaceGuard refuses appends before the disk is full. Badger writes its
// memtable WAL and value log through sparse memory-mapped files: running
// out of space there is a fault that kills the process, not an error, so
// the store keeps a reserve. The free-space figure is cached for a short
// while so the check costs nothing on the append path.
type spaceGuard struct {
	dir   string
	every time.Duration
	free  func(dir string) (free, size uint64, err error)

	// The reserve: set (Config.MinFreeBytes, < 0 disables the check), or
	// auto, the profile's scaled to the filesystem (Profile.Reserve) once
	// its size is known.
	auto bool
	spec profileSpec

	mu      sync.Mutex
	min     int64 // reserve in bytes; < 0: no check
	checked time.Time
	avail   uint64
	size    uint64

	full atomic.Bool // refusing (or failing) appends for lack of space; logged once per episode
}

// init sets g up for cfg: Config.MinFreeBytes, or the reserve
// of the profile (spec) scaled to the filesystem; none in memory.
func (g *spaceGuard) init(cfg Config, spec profileSpec) {
	*g = spaceGuard{dir: cfg.Dir, every: 100 * time.Millisecond, free: diskSpace, min: cfg.MinFreeBytes, spec: spec}
	if cfg.FreeSpace != nil {
		g.free = cfg.FreeSpace
	}
	switch {
	case cfg.InMemory:
		g.min = -1
	case cfg.MinFreeBytes == 0:
		g.auto, g.min = true, spec.minFree // until the filesystem's size is known
	}
}

// refresh reads the filesystem's free space if the cached figure is older
// than every; g.mu is held. It reports whether the figure is known.
func (g *spaceGuard) refresh(now time.Time) bool {
	if g.checked.IsZero() || now.Sub(g.checked) >= g.every {
		avail, size, err := g.free(g.dir)
		if err != nil {
			return !g.checked.IsZero()
		}
		g.avail, g.size, g.checked = avail, size, now
		if g.auto && size > 0 {
			g.min = g.spec.reserve(size)
		}
	}
	return true
}

// check returns an error wrapping ErrNoSpace when the filesystem has less
// free space than the reserve.
func (g *spaceGuard) check(now time.Time) error {
	if g.free == nil {
		return nil
	}
	g.mu.Lock() // before min: refresh sets an auto reserve once the size is known
	defer g.mu.Unlock()
	if g.min < 0 {
		return nil
	}
	if !g.refresh(now) {
		return nil // cannot tell: let Badger try and report
	}
	if g.avail < uint64(g.min) {
		return fmt.Errorf("%w: %d bytes free in %s, below the %d-byte reserve", ErrNoSpace, g.avail, g.dir, g.min)
	}
	return nil
}

// reserve is the reserve in effect (< 0: none).
func (g *spaceGuard) reserve() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.min
}

// refusingWithRoom reports whether appends are refused for lack of space
// while the disk still has room for a reclaim: the memtable flush and the
// compaction a DropPrefix writes, and what value-log GC moves out of a
// file that is nine tenths garbage. Badger writes all of them through
// memory maps, where a full disk is a SIGBUS, not an error; with less room
// the store waits for space to return.
func (g *spaceGuard) refusingWithRoom() bool {
	if !g.full.Load() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.checked.IsZero() && g.avail >= uint64(g.spec.reclaimRoom())
}

func (s profileSpec) reclaimRoom() int64 { return 2*s.memTableSize + s.valueLogFileSize/8 }

// noted records the outcome of a write: the first no-space failure of an
// episode is logged as an error, the first success after it as info.
func (g *spaceGuard) noted(log *slog.Logger, err error) {
	switch {
	case err != nil && errors.Is(err, ErrNoSpace):
		if g.full.CompareAndSwap(false, true) {
			log.Error("disk full: refusing appends until space returns", slog.Any(attrErr, err))
		}
	case err == nil:
		if g.full.CompareAndSwap(true, false) {
			log.Info("disk space available again: appends resumed")
		}
	}
}

// SpaceStatus is the free space of the filesystem holding a store, as its
// appends see it.
type SpaceStatus struct {
	Dir     string
	Free    uint64 // bytes available to unprivileged users
	Size    uint64 // bytes of the filesystem
	Reserve int64  // appends are refused while Free < Reserve; < 0: no check
	Known   bool   // Free and Size were read (false in memory, or when statfs failed)
	// Refusing: appends are refused for lack of space: Free is below the
	// reserve, or the latest commit failed with ENOSPC and none has
	// succeeded since.
	Refusing bool
}

// Space reports the free space and the reserve of the store's filesystem
// (the figure appends use, at most 100 ms old).
func (st *Store) Space() SpaceStatus {
	g := &st.space
	out := SpaceStatus{Dir: g.dir, Reserve: -1}
	if st.cfg.InMemory || g.free == nil {
		return out
	}
	g.mu.Lock()
	out.Known = g.refresh(time.Now())
	out.Free, out.Size, out.Reserve = g.avail, g.size, g.min
	g.mu.Unlock()
	out.Refusing = g.full.Load() || (out.Known && out.Reserve >= 0 && out.Free < uint64(out.Reserve))
	return out
}

// Reserve is the free-space reserve the profile keeps on a filesystem of
// fsSize bytes when Config.MinFreeBytes is 0: a twentieth of the
// filesystem, at least what Badger may write past the last check (two
// value-log files and two memtables: the value-log head may be written to
// its end, a memtable's log and its flush to a table), at most the
// profile's reserve (pi-zero 64 MiB, pi 128 MiB, server 512 MiB). On a
// 200 MB card the server profile keeps 68 MiB, on a 16 GB one 512 MiB.
func (p Profile) Reserve(fsSize uint64) int64 { return p.spec().reserve(fsSize) }

func (s profileSpec) reserve(fsSize uint64) int64 {
	floor := 2*s.valueLogFileSize + 2*s.memTableSize
	return max(floor, min(s.minFree, int64(fsSize/reserveShare)))
}

// reserveShare: the reserve is at most 1/reserveShare of the filesystem
// (above the floor).
const reserveShare = 20

// isNoSpace recognises ENOSPC, also when Badger flattened it into a string.
func isNoSpace(err error) bool {
	return err != nil && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, ErrNoSpace) ||
		strings.Contains(err.Error(), "no space left on device"))
}
