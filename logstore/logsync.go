package logstore

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// logSyncer fsyncs Badger's value-log (.vlog) and memtable-log (.mem)
// files in a store that does not use SyncWrites (no stream asks for fsync
// durability). Badger's own DB.Sync syncs only the newest file of each kind
// (db.go:740, value.go:754). A value-log file Badger moves past is synced
// then (memtable.go:408 truncates it, and ristretto's MmapFile.Truncate
// syncs first), but a memtable log it moves past is not: what was written
// to it since the last sync stays in the page cache until the memtable's
// table is written and synced, which a full level 0 can hold up for long,
// instead of SyncInterval.
//
// sync fsyncs every file of each kind from the newest one the previous
// sync saw on: the files written to since. Value-log files go first, so
// that a synced memtable log never points at values that were not.
type logSyncer struct {
	dir string

	mu   sync.Mutex
	from map[string]int // per extension, the first file id the next sync covers
}

// logExts are the kinds of file a logSyncer syncs, in the order it syncs
// them.
var logExts = []string{".vlog", ".mem"}

// syncFile is fdatasync; tests replace it to see what is synced.
var syncFile = fdatasync

func newLogSyncer(dir string) *logSyncer {
	return &logSyncer{dir: dir, from: map[string]int{}}
}

type logFile struct {
	id   int
	name string
}

func (l *logSyncer) sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("logstore: sync: %w", err)
	}
	files := map[string][]logFile{}
	for _, e := range ents {
		for _, ext := range logExts {
			if base, ok := strings.CutSuffix(e.Name(), ext); ok {
				if id, err := strconv.Atoi(base); err == nil && id >= l.from[ext] {
					files[ext] = append(files[ext], logFile{id, e.Name()})
				}
			}
		}
	}
	for _, ext := range logExts {
		group := files[ext]
		slices.SortFunc(group, func(a, b logFile) int { return cmp.Compare(a.id, b.id) })
		for _, f := range group {
			if err := syncPath(filepath.Join(l.dir, f.name)); err != nil {
				return err
			}
		}
		if len(group) > 0 {
			l.from[ext] = group[len(group)-1].id
		}
	}
	return nil
}

// syncPath fsyncs the file at path. One Badger has deleted meanwhile needs
// none: a memtable log goes once its table is written and synced, a
// value-log file once value-log GC has moved what was live in it.
func syncPath(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("logstore: sync: %w", err)
	}
	defer f.Close()
	if err := syncFile(f); err != nil {
		return fmt.Errorf("logstore: sync %s: %w", filepath.Base(path), err)
	}
	return nil
}
