//go:build linux && (amd64 || arm64)

package cutfs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// mount mounts a fresh disk for a test, or skips where FUSE cannot be
// mounted (not root, or no /dev/fuse).
func mount(t *testing.T) (c *FS, disk, mnt string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cutfs mounts with mount(2): needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	disk, mnt = t.TempDir(), t.TempDir()
	c, err := Mount(disk, mnt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Unmount() })
	return c, disk, mnt
}

func cut(t *testing.T, c *FS) {
	t.Helper()
	if err := c.Unmount(); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	if _, err := c.Cut(); err != nil {
		t.Fatalf("cut: %v", err)
	}
}

// TestCut_KeepsWhatWasFsyncedAndNothingElse: written data survives a cut
// only where an fsync followed it, through write(2) and through a shared
// memory map alike; metadata (a created file, a size set by ftruncate)
// survives at once.
func TestCut_KeepsWhatWasFsyncedAndNothingElse(t *testing.T) {
	c, disk, mnt := mount(t)

	// write(2): "synced" is fsynced, " lost" is not.
	f, err := os.Create(filepath.Join(mnt, "log"))
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, []byte("synced"), 0)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, []byte(" lost"), 6)
	mustWrite(t, f, []byte("S"), 0) // overwrites synced data: undone too
	f.Close()

	// A memory map of a file sized with ftruncate: page 0 msynced, page 1
	// not. In a child process: a page fault on a FUSE mapping in the
	// process that serves the mount can deadlock it (the faulting thread
	// waits for the server, and a stop-the-world GC waits for the thread).
	const page = 4096
	cmd := exec.Command(os.Args[0], "-test.run=^TestMmapWriterHelper$")
	cmd.Env = append(os.Environ(), mmapHelperEnv+"="+filepath.Join(mnt, "map"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mmap writer: %v\n%s", err, out)
	}

	// Never written through the mount: untouched.
	if err := os.WriteFile(filepath.Join(disk, "outside"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	cut(t, c)

	if got, _ := os.ReadFile(filepath.Join(disk, "log")); string(got) != "synced" {
		t.Errorf("log after the cut = %q, want %q", got, "synced")
	}
	got, _ := os.ReadFile(filepath.Join(disk, "map"))
	want := make([]byte, 2*page)
	copy(want, "kept")
	if !bytes.Equal(got, want) {
		t.Errorf("map after the cut: %d bytes, starts %q, page 1 starts %q; want %d bytes, %q, zeros",
			len(got), got[:min(9, len(got))], got[min(page, len(got)):min(page+4, len(got))], len(want), "kept")
	}
	if got, _ := os.ReadFile(filepath.Join(disk, "outside")); string(got) != "x" {
		t.Errorf("a file written outside the mount changed: %q", got)
	}
}

const mmapHelperEnv = "CUTFS_MMAP_FILE"

// TestMmapWriterHelper is the child process of
// TestCut_KeepsWhatWasFsyncedAndNothingElse; it does nothing in a normal
// run. It sizes the file with ftruncate, writes "kept" through a shared
// mapping and msyncs it, then writes more without msync and unmaps.
func TestMmapWriterHelper(t *testing.T) {
	path := os.Getenv(mmapHelperEnv)
	if path == "" {
		return
	}
	const page = 4096
	m, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Truncate(2 * page); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(int(m.Fd()), 0, 2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	copy(b, "kept")
	if err := unix.Msync(b, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	copy(b[page:], "gone")
	copy(b[4:], "+gone")
	if err := unix.Munmap(b); err != nil { // the dirty pages stay in the page cache
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, f *os.File, b []byte, off int64) {
	t.Helper()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
