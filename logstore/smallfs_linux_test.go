//go:build linux

package logstore

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// mountSmallFS makes an ext4 filesystem of sizeMiB in a file, loop-mounts
// it and returns the mount point; cleanup unmounts it. It skips the test,
// saying why, when not root or when the machine has no loop device; a
// missing mkfs.ext4 or mount is a failure (scripts/test-deps.sh installs
// them). No blocks are reserved for root (-m 0): the store sees what a
// small SD card partition gives it.
func mountSmallFS(tb testing.TB, sizeMiB int) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root to loop-mount a small filesystem (CI runs as root)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		tb.Skipf("no loop device on this machine: %v", err)
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Fatalf("%s is missing: run scripts/test-deps.sh (e2fsprogs, mount): %v", tool, err)
		}
	}
	dir := tb.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		tb.Fatal(err)
	}
	if err := f.Truncate(int64(sizeMiB) << 20); err != nil {
		tb.Fatal(err)
	}
	f.Close()
	run := func(name string, args ...string) error {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("mkfs.ext4", "-q", "-F", "-m", "0", img); err != nil {
		tb.Fatal(err)
	}
	if err := run("mount", "-o", "loop", img, mnt); err != nil {
		if strings.Contains(err.Error(), "loop") {
			tb.Skipf("cannot loop-mount here: %v", err)
		}
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := run("umount", mnt); err != nil {
			tb.Errorf("unmount the small filesystem: %v", err)
		}
	})
	return mnt
}
