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
	min   int64 // reserve in bytes; < 0 disables the check
	every time.Duration
	free  func(dir string) (uint64, error)

	mu      sync.Mutex
	checked time.Time
	avail   uint64

	full atomic.Bool // refusing (or failing) appends for lack of space; logged once per episode
}

// check returns an error wrapping ErrNoSpace when the filesystem has less
// free space than the reserve.
func (g *spaceGuard) check(now time.Time) error {
	if g.min < 0 || g.free == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.checked.IsZero() || now.Sub(g.checked) >= g.every {
		avail, err := g.free(g.dir)
		if err != nil {
			return nil // cannot tell: let Badger try and report
		}
		g.avail, g.checked = avail, now
	}
	if g.avail < uint64(g.min) {
		return fmt.Errorf("%w: %d bytes free in %s, below the %d-byte reserve", ErrNoSpace, g.avail, g.dir, g.min)
	}
	return nil
}

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

// isNoSpace recognises ENOSPC, also when Badger flattened it into a string.
func isNoSpace(err error) bool {
	return err != nil && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, ErrNoSpace) ||
		strings.Contains(err.Error(), "no space left on device"))
}
