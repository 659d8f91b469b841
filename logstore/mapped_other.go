//go:build !linux

package logstore

import "errors"

const mappedTrimSupported = false

var errNoPageOut = errors.New("handing mapped pages back is Linux-only")

func fileRSS() (int64, error) { return 0, errNoPageOut }

func pageOutMappings(string) (int, error) { return 0, errNoPageOut }
