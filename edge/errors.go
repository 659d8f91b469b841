package edge

import (
	"errors"
	"slices"
	"strings"
)

// Sentinels of package edge.
var (
	// ErrConfig marks a configuration that cannot be read or is invalid:
	// the command line exits with status 2 on it.
	ErrConfig = errors.New("edge: invalid config")
	// ErrStarted is returned by a second Start.
	ErrStarted = errors.New("edge: node already started")
	// ErrClosed is returned by Start after Close.
	ErrClosed = errors.New("edge: node closed")
)

// Problems lists the problems a configuration error holds (from Parse,
// LoadFile or Validate), one message each, without the ErrConfig prefix.
func Problems(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok && !slices.Contains(j.Unwrap(), ErrConfig) {
			for _, c := range j.Unwrap() {
				walk(c)
			}
			return
		}
		out = append(out, strings.TrimPrefix(e.Error(), ErrConfig.Error()+": "))
	}
	if err != nil {
		walk(err)
	}
	return out
}
