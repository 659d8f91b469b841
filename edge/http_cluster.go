package edge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/edge/status"
)

// siteOr404 is this node's site, or nil after answering 404: outside a
// site the cluster endpoints have nothing to show or do.
func (n *Node) siteOr404(w http.ResponseWriter) *cluster.Site {
	site := n.site.Load()
	if site == nil {
		writeError(w, http.StatusNotFound, "this node is not in a cluster (no cluster: section in its configuration)")
	}
	return site
}

// handleCluster is GET /api/v1/cluster: this node's view of its site
// (cluster.SiteStatus). Outside a site there is nothing to show: 404,
// saying so.
func (n *Node) handleCluster(w http.ResponseWriter, _ *http.Request) {
	site := n.siteOr404(w)
	if site == nil {
		return
	}
	writeJSON(w, http.StatusOK, site.Status())
}

// removeTimeout bounds waiting for the controller to record a removal.
const removeTimeout = 15 * time.Second

// handleRemoveNode is POST /api/v1/cluster/nodes/{id}/remove (`peat
// cluster remove-node`; an admin token where there are tokens): member id
// leaves the site, and the controller moves its replicas to other
// brokers (cluster.Site.RemoveNode); an alive member is drained first,
// serving meanwhile. 202 with the streams being moved; 409 when a dead
// member alone holds a stream's committed records, an alive one's
// streams have no broker to move to, or its going would leave the
// controller's quorum without a majority; 404 for a member the
// controller does not know.
func (n *Node) handleRemoveNode(w http.ResponseWriter, r *http.Request) {
	site := n.siteOr404(w)
	if site == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), removeTimeout)
	defer cancel()
	id := r.PathValue("id")
	rm, err := site.RemoveNode(ctx, id)
	switch {
	case err == nil:
		n.log.Warn("cluster: node removed from the site; its replicas move", "member", id, "moving", rm.Moving,
			"draining", rm.Draining, attrRemote, r.RemoteAddr)
		writeJSON(w, http.StatusAccepted, rm)
	case errors.Is(err, cluster.ErrUnknownBroker):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, cluster.ErrBrokerAlive), errors.Is(err, cluster.ErrIneligibleReplica), errors.Is(err, cluster.ErrQuorum):
		writeError(w, http.StatusConflict, err.Error())
	default:
		writeError(w, http.StatusServiceUnavailable, err.Error())
	}
}

// NodeKept is the answer of POST /api/v1/cluster/nodes/{id}/keep.
type NodeKept struct {
	Node string `json:"node"`
}

// handleKeepNode is POST /api/v1/cluster/nodes/{id}/keep (`peat cluster
// keep-node`; an admin token where there are tokens): a drain started by
// remove-node ends and member id stays in the site
// (cluster.Site.KeepNode). 200 once recorded (also for a member not
// draining); 409 for a member already removed; 404 for one the
// controller does not know.
func (n *Node) handleKeepNode(w http.ResponseWriter, r *http.Request) {
	site := n.siteOr404(w)
	if site == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), removeTimeout)
	defer cancel()
	id := r.PathValue("id")
	err := site.KeepNode(ctx, id)
	switch {
	case err == nil:
		n.log.Warn("cluster: node kept in the site; its drain, if any, ended", "member", id, attrRemote, r.RemoteAddr)
		writeJSON(w, http.StatusOK, NodeKept{Node: id})
	case errors.Is(err, cluster.ErrUnknownBroker):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, cluster.ErrRemovedBroker):
		writeError(w, http.StatusConflict, err.Error())
	default:
		writeError(w, http.StatusServiceUnavailable, err.Error())
	}
}

// handleRebalance is POST /api/v1/cluster/rebalance (`peat cluster
// rebalance`; an admin token where there are tokens): replicas move from
// the brokers holding the most to those holding the fewest, add first
// and remove after, until their counts are within one
// (cluster.Site.Rebalance). 202 with the moves recorded; 200 with none
// when there is nothing to move (Balanced says whether the site is, or
// whether the streams that would move are busy); 409 when the
// controller refused the plan (its state moved on, or it runs a Peat
// without rebalance).
func (n *Node) handleRebalance(w http.ResponseWriter, r *http.Request) {
	site := n.siteOr404(w)
	if site == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), removeTimeout)
	defer cancel()
	rb, err := site.Rebalance(ctx)
	switch {
	case err == nil && len(rb.Moves) == 0:
		writeJSON(w, http.StatusOK, rb)
	case err == nil:
		n.log.Warn("cluster: rebalance: replicas move", "moves", rb.Moves, attrRemote, r.RemoteAddr)
		writeJSON(w, http.StatusAccepted, rb)
	case errors.Is(err, cluster.ErrBadReplicas), errors.Is(err, cluster.ErrIneligibleReplica),
		errors.Is(err, cluster.ErrUnknownBroker), errors.Is(err, cluster.ErrUnknownStream),
		errors.Is(err, cluster.ErrRemovedBroker), errors.Is(err, cluster.ErrBadCommand):
		writeError(w, http.StatusConflict, err.Error())
	default:
		writeError(w, http.StatusServiceUnavailable, err.Error())
	}
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

// clusterAlarms are the site's conditions an operator must act on: a
// stream without a leader refuses publishes (critical); one with a short
// ISR is a failure away from it, and a node not caught up serves less
// than the site committed (warnings).
func clusterAlarms(cs *cluster.SiteStatus) []status.Alarm {
	if cs == nil {
		return nil
	}
	var out []status.Alarm
	if !cs.Ready {
		out = append(out, status.Alarm{ID: status.AlarmNotCaughtUp, Severity: status.SeverityWarning,
			Message: fmt.Sprintf("this node has not caught up with the site (/readyz 503): %s", cs.NotReady)})
	}
	for _, s := range cs.Streams {
		switch {
		case s.Leader == "":
			out = append(out, status.Alarm{ID: status.AlarmStreamOffline, Severity: status.SeverityCritical,
				Message: fmt.Sprintf("stream %s has no leader: its publishes are refused until a member of its ISR (%s) is back",
					s.Name, strings.Join(s.ISR, ", "))})
		case s.UnderReplicated && s.Name == cluster.SessionsStream:
			// The node that took a replica of it took one of the
			// configured streams' too: their alarm says it.
		case s.UnderReplicated && len(s.Replicas) < s.ReplicationFactor:
			out = append(out, status.Alarm{ID: status.AlarmUnderReplicated, Severity: status.SeverityWarning,
				Message: fmt.Sprintf("stream %s is under-replicated: %d replicas (%s) of replication factor %d; "+
					"it gets more as brokers join", s.Name, len(s.Replicas), strings.Join(s.Replicas, ", "), s.ReplicationFactor)})
		case s.UnderReplicated:
			out = append(out, status.Alarm{ID: status.AlarmUnderReplicated, Severity: status.SeverityWarning,
				Message: fmt.Sprintf("stream %s is under-replicated: ISR %s of replicas %s",
					s.Name, strings.Join(s.ISR, ", "), strings.Join(s.Replicas, ", "))})
		}
	}
	return out
}
