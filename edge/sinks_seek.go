package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/peatmq/peat/edge/sink"
)

// seekTimeout bounds a seek's commit: in a site it goes through the
// stream's leader.
const seekTimeout = 10 * time.Second

// seekRequest is the body of POST /api/v1/sinks/{name}/seek.
type seekRequest struct {
	Stream string  `json:"stream"`
	Offset *uint64 `json:"offset"`
}

// handleSinkSeek moves a sink's position in one of its streams: it sends
// again from there, or skips what lies before it. A sink's position is
// its consumer group "$sink.<name>", which no MQTT client can reach, so
// this (an admin's request when tokens are on) is the one way to move it.
func (n *Node) handleSinkSeek(w http.ResponseWriter, r *http.Request) {
	set, s := n.sinkNamed(w, r)
	if s == nil {
		return
	}
	var req seekRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Stream == "" || req.Offset == nil {
		writeError(w, http.StatusBadRequest, `want a JSON body {"stream": "<name>", "offset": <offset>}`)
		return
	}
	st := set.status(s)
	if !slices.ContainsFunc(st.Streams, func(ss sink.StreamStatus) bool { return ss.Stream == req.Stream }) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("sink %q does not send stream %q", s.Name(), req.Stream))
		return
	}
	b := n.broker.Load()
	if b == nil {
		writeError(w, http.StatusServiceUnavailable, "the broker is not running")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), seekTimeout)
	defer cancel()
	if err := b.CommitGroup(ctx, sink.GroupPrefix+s.Name(), req.Stream, *req.Offset); err != nil {
		writeError(w, http.StatusConflict, err.Error())
		return
	}
	n.log.Info("sink moved", attrComponent, "sink", attrSinkName, s.Name(), attrStreamName, req.Stream, "offset", *req.Offset)
	writeJSON(w, http.StatusOK, set.status(s))
}
