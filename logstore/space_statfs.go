//go:build linux || darwin || freebsd

package logstore

import "syscall"

// diskFree returns the bytes available to unprivileged users on the
// filesystem holding dir.
func diskFree(dir string) (uint64, error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return 0, err
	}
	return uint64(fs.Bavail) * uint64(fs.Bsize), nil
}
