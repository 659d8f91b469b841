package cluster

import (
	"errors"

	"github.com/peatmq/peat/cluster/rules"
)

// The controller's refusals, decided by the rules package: the same
// values, so errors.Is matches either name.
var (
	ErrUnknownStream     = rules.ErrUnknownStream
	ErrStreamExists      = rules.ErrStreamExists
	ErrUnknownBroker     = rules.ErrUnknownBroker
	ErrStaleBrokerEpoch  = rules.ErrStaleBrokerEpoch
	ErrStaleLeaderEpoch  = rules.ErrStaleLeaderEpoch
	ErrStaleVersion      = rules.ErrStaleVersion
	ErrIneligibleReplica = rules.ErrIneligibleReplica
	ErrBadReplicas       = rules.ErrBadReplicas
	ErrBadCommand        = rules.ErrBadCommand
	ErrBrokerAlive       = rules.ErrBrokerAlive
	ErrRemovedBroker     = rules.ErrRemovedBroker
	ErrStreamListed      = rules.ErrStreamListed
	ErrQuorum            = rules.ErrQuorum
)

// ErrNotController: a command reached a node that is not the controller.
var ErrNotController = errors.New("cluster: this node is not the controller")
