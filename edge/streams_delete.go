package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/logstore"
)

// StreamDeletion is the answer of DELETE /api/v1/streams/{name}.
type StreamDeletion struct {
	Name string `json:"name"`
	// Records and Bytes are what this node deleted (0 in a site, where
	// every replica deletes its copy once the controller recorded it).
	Records uint64 `json:"records"`
	Bytes   int64  `json:"bytes"`
	// Site: the controller recorded the deletion; every replica deletes
	// its copy, a replica down now when it returns.
	Site bool `json:"site,omitempty"`
}

// deleteTimeout bounds waiting for the controller to record a deletion.
const deleteTimeout = 15 * time.Second

// handleDeleteStream is DELETE /api/v1/streams/{name} (`peat stream
// delete`; an admin token where there are tokens). A stream the node's
// configuration lists is refused (409): it must leave streams: first, so
// that a stream is deleted only by this command and never because a line
// went missing. On a single node the stored stream is deleted before the
// answer (200); in a site the controller records it (202) and every
// replica deletes its copy (cluster.Site.DeleteStream). Both delete the
// positions a Peat of key layout 3 kept of it in the node's own state
// first (mqtt.ForgetLegacy): a single node's broker holds some of them
// in memory, so there the deletion waits until it runs (503 before).
func (n *Node) handleDeleteStream(w http.ResponseWriter, r *http.Request) {
	store := n.store.Load()
	if store == nil {
		writeError(w, http.StatusServiceUnavailable, "the log is not open")
		return
	}
	name := r.PathValue("name")
	if store.Stream(name) != nil {
		writeError(w, http.StatusConflict, fmt.Sprintf("stream %q is listed in this node's configuration: "+
			"remove it from streams: and restart peat, then delete it", name))
		return
	}
	if site := n.site.Load(); site != nil {
		ctx, cancel := context.WithTimeout(r.Context(), deleteTimeout)
		defer cancel()
		err := site.DeleteStream(ctx, name)
		switch {
		case err == nil:
			n.log.Warn("stream deleted from the site; every replica deletes its copy", attrStreamName, name, attrRemote, r.RemoteAddr)
			writeJSON(w, http.StatusAccepted, StreamDeletion{Name: name, Site: true})
		case errors.Is(err, cluster.ErrUnknownStream):
			writeError(w, http.StatusNotFound, err.Error())
		case errors.Is(err, cluster.ErrStreamListed):
			writeError(w, http.StatusConflict, err.Error())
		default:
			writeError(w, http.StatusServiceUnavailable, err.Error())
		}
		return
	}
	broker := n.broker.Load()
	if broker == nil {
		writeError(w, http.StatusServiceUnavailable, "the node is starting: try again")
		return
	}
	var gone StreamDeletion
	if un, err := store.Unlisted(); err == nil {
		for _, u := range un {
			if u.Name == name {
				gone = StreamDeletion{Name: name, Records: u.NextOffset - u.FirstOffset, Bytes: u.Bytes}
			}
		}
	}
	// Positions an older Peat kept of it by name go first (a stop in
	// between leaves the stream without them, never them without it).
	if gone.Name != "" {
		if err := broker.ForgetLegacy(r.Context(), name); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	err := store.DeleteStream(name)
	switch {
	case err == nil:
		n.log.Warn("stream deleted", attrStreamName, name, slog.Uint64("records", gone.Records),
			slog.Int64("bytes", gone.Bytes), attrRemote, r.RemoteAddr)
		writeJSON(w, http.StatusOK, gone)
	case errors.Is(err, logstore.ErrUnknownStream):
		writeError(w, http.StatusNotFound, fmt.Sprintf("no stored stream named %q", name))
	case errors.Is(err, logstore.ErrStreamListed):
		writeError(w, http.StatusConflict, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

// unlistedInfos are the stored streams no stream of the store serves, as
// GET /api/v1/streams shows them (Unlisted set).
func unlistedInfos(store *logstore.Store) []StreamInfo {
	un, err := store.Unlisted()
	if err != nil {
		return nil
	}
	out := make([]StreamInfo, 0, len(un))
	for _, u := range un {
		out = append(out, StreamInfo{Name: u.Name, Filters: []string{}, FirstOffset: u.FirstOffset,
			NextOffset: u.NextOffset, CommittedOffset: u.NextOffset, Bytes: u.Bytes, Unlisted: true})
	}
	return out
}

// logUnlisted tells the operator at start which stored streams the
// configuration no longer lists: they stay on disk until deleted.
func (n *Node) logUnlisted(store *logstore.Store) {
	un, err := store.Unlisted()
	if err != nil {
		n.log.Warn("could not list the stored streams the configuration does not list", attrErr, err)
		return
	}
	for _, u := range un {
		n.log.Warn("stored stream not in the configuration: kept on disk, unread; `peat stream delete` deletes it",
			attrStreamName, u.Name, slog.Uint64("records", u.NextOffset-u.FirstOffset), slog.Int64("bytes", u.Bytes))
	}
}
