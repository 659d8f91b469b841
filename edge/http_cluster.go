package edge

import (
	"net/http"

	"github.com/peatmq/peat/cluster"
)

// handleCluster is GET /api/v1/cluster: this node's view of its site
// (cluster.SiteStatus). Outside a site there is nothing to show: 404,
// saying so.
func (n *Node) handleCluster(w http.ResponseWriter, _ *http.Request) {
	site := n.site.Load()
	if site == nil {
		writeError(w, http.StatusNotFound, "this node is not in a cluster (no cluster: section in its configuration)")
		return
	}
	writeJSON(w, http.StatusOK, site.Status())
}

// clusterStatus is the cluster block of /api/v1/status, nil outside a
// site.
func (n *Node) clusterStatus() *cluster.SiteStatus {
	site := n.site.Load()
	if site == nil {
		return nil
	}
	st := site.Status()
	return &st
}

// notCaughtUp is why /readyz fails in a site ("" when the node serves its
// part): a node that is a replica outside an ISR, or that knows no
// controller, takes connections but does not yet hold what the site
// committed.
func (n *Node) notCaughtUp() string {
	site := n.site.Load()
	if site == nil {
		return ""
	}
	if ok, why := site.CaughtUp(); !ok {
		return "not caught up with the site: " + why
	}
	return ""
}
