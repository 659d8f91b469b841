//go:build linux || darwin || freebsd

package logstore

import "syscall"

// diskSpace returns the bytes available to unprivileged users on the
// filesystem holding dir, and its size.
func diskSpace(dir string) (free, size uint64, err error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return 0, 0, err
	}
	return uint64(fs.Bavail) * uint64(fs.Bsize), uint64(fs.Blocks) * uint64(fs.Bsize), nil
}

// diskFree returns the bytes available to unprivileged users on the
// filesystem holding dir.
func diskFree(dir string) (uint64, error) {
	free, _, err := diskSpace(dir)
	return free, err
}
