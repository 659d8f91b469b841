//go:build !unix

package logstore

import "os"

// allocated is the space a file takes on disk (its size where the blocks
// are not known).
func allocated(fi os.FileInfo) int64 { return fi.Size() }
