//go:build linux && (amd64 || arm64)

// Package cutfs is a FUSE file system for power-cut tests. It mounts a
// directory (the disk) at another path, passes every operation through,
// and remembers, for each file, what the file held when it was last
// fsynced. After the mount is gone, Cut turns the disk back into that
// state, as a power cut would: data written since a file's last fsync is
// lost, whether it came from write(2) or from a shared memory map (the
// kernel writes a mapping's dirty pages through FUSE WRITE requests, and
// msync reaches the file system as an FSYNC after them).
//
// The model is a journaling file system's in ordered mode, simplified:
// metadata (creating, renaming and removing files, and sizes set with
// ftruncate) is durable at once; file contents, and a file's growth by
// writes, only at the file's next fsync. Newly allocated regions that
// were never synced read back as zeros, as unwritten extents do. Page
// cache that a killed process left dirty is written back when the mount
// is taken down, and Cut undoes it like any other unsynced write.
//
// Linux on 64-bit machines only: go-fuse's splice code does not compile
// where syscall.Splice returns an int of 32 bits, and nothing runs the
// power-cut tests there.
package cutfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// FS is a mounted cut file system.
type FS struct {
	disk   string // the backing directory
	mnt    string
	server *fuse.Server

	mu struct {
		sync.Mutex
		files map[uint64]*fileLog // by the backing file's inode number
	}
}

// fileLog is what a file needs undone at a cut: the writes since its last
// fsync, oldest first, with the bytes each one overwrote, and the size
// the file had then.
type fileLog struct {
	size int64
	undo []undoWrite
}

type undoWrite struct {
	off int64
	old []byte // what was there; shorter than the write where it went past the end
}

// Mount mounts disk at mnt (both directories). The caller must be root:
// it mounts with mount(2), without fusermount.
func Mount(disk, mnt string) (*FS, error) {
	c := &FS{disk: disk, mnt: mnt}
	c.mu.files = map[uint64]*fileLog{}
	var st syscall.Stat_t
	if err := syscall.Stat(disk, &st); err != nil {
		return nil, fmt.Errorf("cutfs: %w", err)
	}
	data := &gofs.LoopbackRoot{Path: disk, Dev: uint64(st.Dev)}
	root := &node{LoopbackNode: gofs.LoopbackNode{RootData: data}, c: c}
	data.RootNode = root
	zero := time.Duration(0)
	opts := &gofs.Options{
		MountOptions: fuse.MountOptions{DirectMount: true, DirectMountStrict: true, FsName: "cutfs", Name: "cutfs"},
		// No attribute or entry caching: a size set through one path is
		// seen at once through every other.
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
	}
	server, err := gofs.Mount(mnt, root, opts)
	if err != nil {
		return nil, fmt.Errorf("cutfs: mount %s: %w", mnt, err)
	}
	c.server = server
	return c, nil
}

// Unmount takes the mount down; writes the kernel still held reach the
// disk (and the undo logs) first. Call it after the processes using the
// mount are gone.
func (c *FS) Unmount() error {
	if c.server == nil {
		return nil
	}
	if err := c.server.Unmount(); err != nil {
		// Busy: something still has a file open on the mount. Waiting
		// for the server would wait for that forever.
		return fmt.Errorf("cutfs: unmount %s: %w", c.mnt, err)
	}
	c.server.Wait()
	c.server = nil
	return nil
}

// Cut undoes, on the disk, every write made through the mount since the
// written file's last fsync. It returns how many files it changed. The
// mount must be down (Unmount): the kernel would otherwise serve what it
// cached.
func (c *FS) Cut() (int, error) {
	if c.server != nil {
		return 0, errors.New("cutfs: cut while mounted")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := 0
	err := filepath.WalkDir(c.disk, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			return err
		}
		lg := c.mu.files[st.Ino]
		if lg == nil {
			return nil
		}
		if len(lg.undo) > 0 || st.Size != lg.size {
			changed++
		}
		return lg.revert(path)
	})
	c.mu.files = map[uint64]*fileLog{}
	return changed, err
}

// revert writes back what the unsynced writes overwrote, newest first, and
// gives the file its size at the last fsync.
func (lg *fileLog) revert(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	for i := len(lg.undo) - 1; i >= 0; i-- {
		u := lg.undo[i]
		if _, err := f.WriteAt(u.old, u.off); err != nil {
			return err
		}
	}
	return f.Truncate(lg.size)
}

// logOfLocked returns the log of the file open as fd, starting one (at the
// file's current size) if there is none.
func (c *FS) logOfLocked(fd int) (*fileLog, syscall.Errno) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, gofs.ToErrno(err)
	}
	lg := c.mu.files[st.Ino]
	if lg == nil {
		lg = &fileLog{size: st.Size}
		c.mu.files[st.Ino] = lg
	}
	return lg, 0
}

// node is a loopback node whose open files are logged.
type node struct {
	gofs.LoopbackNode
	c *FS
}

var (
	_ gofs.NodeOpener      = (*node)(nil)
	_ gofs.NodeCreater     = (*node)(nil)
	_ gofs.NodeSetattrer   = (*node)(nil)
	_ gofs.NodeUnlinker    = (*node)(nil)
	_ gofs.NodeRenamer     = (*node)(nil)
	_ gofs.NodeWrapChilder = (*node)(nil)
)

// WrapChild makes every node the loopback creates below the root one of
// ours, so that each file's writes and fsyncs are seen.
func (n *node) WrapChild(_ context.Context, _ gofs.InodeEmbedder) gofs.InodeEmbedder {
	return &node{LoopbackNode: gofs.LoopbackNode{RootData: n.RootData}, c: n.c}
}

// Unlink forgets the removed file's log: its inode number may be reused by
// a new file, which must not get the old one's undo.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	ino, known := inodeOf(filepath.Join(n.backing(), name))
	errno := n.LoopbackNode.Unlink(ctx, name)
	if errno == 0 && known {
		n.c.forget(ino)
	}
	return errno
}

// Rename forgets the log of a file the rename replaces, as Unlink does.
func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	var target string
	if p, ok := newParent.(*node); ok {
		target = filepath.Join(p.backing(), newName)
	}
	src, _ := inodeOf(filepath.Join(n.backing(), name))
	ino, replaced := inodeOf(target)
	errno := n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
	if errno == 0 && replaced && ino != src {
		n.c.forget(ino)
	}
	return errno
}

// backing is the node's path on the disk.
func (n *node) backing() string { return filepath.Join(n.RootData.Path, n.Path(n.Root())) }

// inodeOf returns the inode number of path on the disk.
func inodeOf(path string) (uint64, bool) {
	var st syscall.Stat_t
	if path == "" || syscall.Lstat(path, &st) != nil {
		return 0, false
	}
	return st.Ino, true
}

func (c *FS) forget(ino uint64) {
	c.mu.Lock()
	delete(c.mu.files, ino)
	c.mu.Unlock()
}

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return n.c.wrap(fh), fuseFlags, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	in, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return in, n.c.wrap(fh), fuseFlags, 0
}

// Setattr with a size is metadata: durable at once. Through an open file,
// file.Setattr logs it; here, truncate(2) by name.
func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	errno := n.LoopbackNode.Setattr(ctx, f, in, out)
	size, ok := in.GetSize()
	if errno != 0 || !ok || f != nil {
		return errno
	}
	var st syscall.Stat_t
	if err := syscall.Stat(n.backing(), &st); err != nil {
		return gofs.ToErrno(err)
	}
	n.c.mu.Lock()
	if lg := n.c.mu.files[st.Ino]; lg != nil {
		lg.size = int64(size)
	}
	n.c.mu.Unlock()
	return 0
}

// file is an open file whose writes and fsyncs are logged.
type file struct {
	*gofs.LoopbackFile
	c *FS

	mu sync.Mutex
	rd *os.File // the same file opened for reading (the handle may be write-only); nil until a write
}

func (c *FS) wrap(fh gofs.FileHandle) gofs.FileHandle {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok {
		return fh
	}
	return &file{LoopbackFile: lf, c: c}
}

// PassthroughFd refuses the kernel's passthrough mode, which would send
// reads and writes to the disk without this file system seeing them.
func (f *file) PassthroughFd() (int, bool) { return 0, false }

func (f *file) fd() (int, syscall.Errno) {
	fd, ok := f.LoopbackFile.PassthroughFd()
	if !ok {
		return 0, syscall.EBADF
	}
	return fd, 0
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	fd, errno := f.fd()
	if errno != 0 {
		return 0, errno
	}
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	lg, errno := f.c.logOfLocked(fd)
	if errno != 0 {
		return 0, errno
	}
	rd, err := f.reader(fd)
	if err != nil {
		return 0, gofs.ToErrno(err)
	}
	old := make([]byte, len(data))
	n, err := rd.ReadAt(old, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, gofs.ToErrno(err)
	}
	if n > 0 {
		lg.undo = append(lg.undo, undoWrite{off: off, old: old[:n]})
	}
	w, err := syscall.Pwrite(fd, data, off)
	return uint32(w), gofs.ToErrno(err)
}

// reader returns the file, open for reading, to save what a write
// overwrites.
func (f *file) reader(fd int) (*os.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rd == nil {
		rd, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", fd))
		if err != nil {
			return nil, err
		}
		f.rd = rd
	}
	return f.rd, nil
}

func (f *file) Release(ctx context.Context) syscall.Errno {
	f.mu.Lock()
	if f.rd != nil {
		f.rd.Close()
		f.rd = nil
	}
	f.mu.Unlock()
	return f.LoopbackFile.Release(ctx)
}

func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	fd, errno := f.fd()
	if errno != 0 {
		return errno
	}
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return gofs.ToErrno(err)
	}
	f.c.mu.files[st.Ino] = &fileLog{size: st.Size}
	return 0
}

func (f *file) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if errno := f.LoopbackFile.Setattr(ctx, in, out); errno != 0 {
		return errno
	}
	if size, ok := in.GetSize(); ok {
		fd, errno := f.fd()
		if errno != 0 {
			return errno
		}
		f.c.mu.Lock()
		lg, errno := f.c.logOfLocked(fd)
		if errno == 0 {
			lg.size = int64(size)
		}
		f.c.mu.Unlock()
		return errno
	}
	return 0
}
