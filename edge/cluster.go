package edge

import (
	"fmt"

	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/edge/mirror"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// startSite joins the node's site over store (opened with ManualCommit)
// and returns the log the broker serves: the site's, whose appends are
// acknowledged once the stream's ISR holds them. n.mu is held.
func (n *Node) startSite(store *logstore.Store) (mqtt.Log, error) {
	sc := n.cfg.SiteConfig()
	sc.Store = store
	sc.Logger = n.log // the cluster's parts name themselves (component=raft, serf, ...)
	if b := n.build.Load(); b != nil {
		sc.Node.Version = b.Version
	}
	sc.Node.MQTTAddr = n.cfg.MQTT.Listen
	sc.Mirror = mirror.Apply // the rules, run on a mirror stream's leader
	site, err := cluster.StartSite(sc)
	if err != nil {
		return nil, fmt.Errorf("join site %q: %w", n.cfg.Cluster.Name, err)
	}
	n.mu.site = site
	n.site.Store(site)
	n.log.Info("cluster node started", "node_id", sc.Node.NodeID, "site", sc.Node.Site,
		"serf", site.Node.SerfAddr(), "raft", site.Node.RaftAddr(), "transport", site.Server.Addr(),
		"broker_epoch", site.Node.Epoch(), "voter", sc.Node.Voter)
	return siteLog{site.Log, store}, nil
}

// siteLog is the site's log, except that a topic a configured stream
// captures is never passed through unstored: until the controller has
// the stream and this node serves it (a site still forming, a node
// without a replica), its publishes are refused, not acknowledged.
type siteLog struct {
	*cluster.Log
	store *logstore.Store
}

// Route asks the store's router, which has every configured stream's
// filters: the site's own has only those it serves, and would send a
// topic of a stream it lacks to another stream with a wider filter.
func (l siteLog) Route(topic string) mqtt.Stream {
	s := l.store.Route(topic)
	if s == nil {
		return nil
	}
	if v := l.Log.Stream(s.Name()); v != nil {
		return v
	}
	return notServed{s}
}

// notServed is a configured stream the site does not serve on this node.
type notServed struct{ *logstore.Stream }

func (s notServed) AppendAsync(_ []*logstore.Record, done func(uint64, error)) {
	done(0, fmt.Errorf("stream %s is not served by this node yet (the site is forming, or it holds no replica): %w",
		s.Name(), mqtt.ErrLeaderUnavailable))
}

// stopSite closes the site's part of the node, after the broker and
// before the store; n.mu is held.
func (n *Node) stopSite() error {
	if n.mu.site == nil {
		return nil
	}
	n.site.Store(nil)
	err := n.mu.site.Close()
	n.mu.site = nil
	if err != nil {
		return fmt.Errorf("leave site: %w", err)
	}
	return nil
}
