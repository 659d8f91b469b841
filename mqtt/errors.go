package mqtt

import "errors"

// Sentinel errors. Errors returned by this package wrap them; test with
// errors.Is.
var (
	// ErrClosed is returned by Start on a closed Broker.
	ErrClosed = errors.New("mqtt: broker closed")
	// ErrStarted is returned by a second Start.
	ErrStarted = errors.New("mqtt: broker already started")
	// ErrInvalidConfig is wrapped by New's error for a Config that does not
	// validate.
	ErrInvalidConfig = errors.New("mqtt: invalid config")
)
