//go:build !(linux || darwin || freebsd)

package logstore

import "errors"

var errSpaceUnknown = errors.New("logstore: free space unknown on this platform")

// diskSpace is not implemented here: the check is skipped.
func diskSpace(string) (free, size uint64, err error) { return 0, 0, errSpaceUnknown }

// diskFree is not implemented here.
func diskFree(string) (uint64, error) { return 0, errSpaceUnknown }
