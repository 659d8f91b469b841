package edge

import (
	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/edge/sink"
)

// siteLeadership tells a site's sinks where each stream is sent from: the
// node whose Replicator runs the stream's Leader in the leader epoch the
// controller's state names. Its log is the one followers truncate to, and
// it is where the sink's position is written first.
//
// A leader cut off from the controller for the Raft heartbeat timeout
// holds (sends nothing new) as its Leader stops committing
// (Node.HearsController): the controller deposes it only later, after
// Serf's failure detection, so the two leaders of a partition do not both
// drain a backlog. Holding keeps the connection and the window: a
// heartbeat missed under load costs no reconnect and no resend.
type siteLeadership struct{ site *cluster.Site }

var (
	_ sink.Leadership = siteLeadership{}
	_ sink.Holder     = siteLeadership{}
)

func (l siteLeadership) Leader(stream string) (leader string, epoch uint64, here bool) {
	leader, e, here := l.site.StreamLeader(stream)
	return leader, uint64(e), here
}

// Hold is true while this node has not heard from the controller for the
// Raft heartbeat timeout.
func (l siteLeadership) Hold() bool { return !l.site.HearsController() }

// Changed closes when the Replicator next looks at the state: after every
// change of leader, here or elsewhere.
func (l siteLeadership) Changed() <-chan struct{} { return l.site.LeadersChanged() }

// clientID is the client id a sink connects upstream with. In a site each
// node has its own, <client_id>-<node_id>: nodes leading different
// streams of one sink are connected at once, and with one id the broker
// would keep taking the session from one to give it to the other.
func (e sinkEnv) clientID(id string) string {
	if e.site == nil {
		return id
	}
	return id + "-" + e.node
}
