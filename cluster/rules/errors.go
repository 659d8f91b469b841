package rules

import "errors"

// The controller's refusals. A command the state refuses changes nothing,
// on every node alike; raft hands the error back to the node that
// proposed it. The messages keep the "cluster:" prefix users and logs
// have always seen: they are the site's answers, whichever package
// decides them.
var (
	ErrUnknownStream     = errors.New("cluster: unknown stream")
	ErrStreamExists      = errors.New("cluster: stream exists with other replicas")
	ErrUnknownBroker     = errors.New("cluster: unknown broker")
	ErrStaleBrokerEpoch  = errors.New("cluster: stale broker epoch")
	ErrStaleLeaderEpoch  = errors.New("cluster: stale leader or leader epoch")
	ErrStaleVersion      = errors.New("cluster: stale stream version")
	ErrIneligibleReplica = errors.New("cluster: replica not eligible")
	ErrBadReplicas       = errors.New("cluster: bad replica list")
	ErrBadCommand        = errors.New("cluster: malformed controller command")
	ErrBrokerAlive       = errors.New("cluster: broker is alive")
	ErrRemovedBroker     = errors.New("cluster: broker was removed from the site")
	// ErrStreamListed refuses a DeleteStream while a broker's
	// configuration lists the stream.
	ErrStreamListed = errors.New("cluster: stream is listed in a node's configuration")
)

// ErrQuorum refuses taking a voter out of the controller's quorum when
// the voters left alive would not be a majority of those remaining
// (QuorumWithout).
var ErrQuorum = errors.New("cluster: the controller's quorum would be lost")
