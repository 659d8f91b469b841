package rules

import (
	"fmt"
	"slices"
)

// QuorumWithout checks that Raft keeps a quorum once voter id stops
// voting: the other voters alive now must be a majority of the voters
// that remain. A 3-voter site with one voter down cannot lose another.
func QuorumWithout(id string, voters []string, alive func(string) bool) error {
	if !slices.Contains(voters, id) {
		return nil
	}
	var rest, up []string
	for _, v := range voters {
		if v == id {
			continue
		}
		rest = append(rest, v)
		if alive(v) {
			up = append(up, v)
		}
	}
	if len(rest) == 0 {
		return fmt.Errorf("%w: %s is the site's only voter: make another node a voter first", ErrQuorum, id)
	}
	if need := len(rest)/2 + 1; len(up) < need {
		return fmt.Errorf("%w: without voter %s, %d of the %d remaining voters (%v) are alive and Raft needs %d: "+
			"bring a voter back, or remove the dead one first", ErrQuorum, id, len(up), len(rest), up, need)
	}
	return nil
}

// MinInsync is the min_insync_replicas a stream of replicas replicas
// runs with: the configured one, else 2 from 3 replicas on (one replica
// may be lost with every acknowledged record on two), else 1 (a stream of
// 2 keeps taking publishes with one replica down, as Kafka's default).
func MinInsync(configured, replicas int) int {
	switch {
	case configured > 0:
		return configured
	case replicas >= 3:
		return 2
	default:
		return 1
	}
}
