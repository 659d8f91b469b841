//go:build unix

package main

import (
	"os"
	"syscall"
)

// keepOwner gives the new file the owner and group of the one it
// replaces (root editing /etc/peat/users must not take it from the
// peat group).
func keepOwner(tmp *os.File, old os.FileInfo) error {
	st, ok := old.Sys().(*syscall.Stat_t)
	if !ok || os.Geteuid() != 0 {
		return nil
	}
	return tmp.Chown(int(st.Uid), int(st.Gid))
}
