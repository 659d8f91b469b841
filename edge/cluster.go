package edge

import (
	"fmt"

	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// startSite joins the node's site over store (opened with ManualCommit)
// and returns the log the broker serves: the site's, whose appends are
// acknowledged once the stream's ISR holds them. n.mu is held.
func (n *Node) startSite(store *logstore.Store) (mqtt.Log, error) {
	sc := n.cfg.SiteConfig()
	sc.Store = store
	sc.Logger = n.log.With(attrComponent, "cluster")
	if b := n.build.Load(); b != nil {
		sc.Node.Version = b.Version
	}
	sc.Node.MQTTAddr = n.cfg.MQTT.Listen
	site, err := cluster.StartSite(sc)
	if err != nil {
		return nil, fmt.Errorf("join site %q: %w", n.cfg.Cluster.Name, err)
	}
	n.mu.site = site
	n.site.Store(site)
	n.log.Info("cluster node started", "node_id", sc.Node.NodeID, "site", sc.Node.Site,
		"serf", site.Node.SerfAddr(), "raft", site.Node.RaftAddr(), "transport", site.Server.Addr(),
		"broker_epoch", site.Node.Epoch(), "voter", sc.Node.Voter)
	return site.Log, nil
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
