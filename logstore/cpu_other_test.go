//go:build !unix

package logstore

import "time"

// processCPU is not known here.
func processCPU() time.Duration { return -1 }
