//go:build unix

package logstore

import (
	"os"
	"syscall"
)

// allocated is the space a file takes on disk.
func allocated(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
