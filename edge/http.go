package edge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/peatmq/peat/edge/status"
	"github.com/peatmq/peat/logstore"
)

// StreamInfo is one stream as GET /api/v1/streams shows it.
type StreamInfo struct {
	Name            string   `json:"name"`
	Filters         []string `json:"filters"`
	FirstOffset     uint64   `json:"first_offset"`
	NextOffset      uint64   `json:"next_offset"`
	CommittedOffset uint64   `json:"committed_offset"`
	Bytes           int64    `json:"bytes"`
	// Unlisted: stored, but no longer in the configuration; kept on disk,
	// unread, until `peat stream delete` (streams_delete.go).
	Unlisted bool `json:"unlisted,omitempty"`
}

// apiError is the body of every error the HTTP API returns.
type apiError struct {
	Error string `json:"error"`
}

// Handler is the node's HTTP API (see the package documentation).
func (n *Node) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", n.handleHealth)
	mux.HandleFunc("GET /readyz", n.handleReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{
		ErrorLog: slogPrinter{n}, Registry: n.reg,
	}))
	mux.HandleFunc("GET /api/v1/streams", n.handleStreams)
	mux.HandleFunc("GET /api/v1/streams/{name}", n.handleStream)
	mux.HandleFunc("DELETE /api/v1/streams/{name}", n.handleDeleteStream)
	mux.HandleFunc("GET /api/v1/status", n.handleStatus)
	mux.HandleFunc("GET /api/v1/groups", n.handleGroups)
	mux.HandleFunc("GET /api/v1/cluster", n.handleCluster)
	mux.HandleFunc("POST /api/v1/cluster/nodes/{id}/remove", n.handleRemoveNode)
	mux.HandleFunc("POST /api/v1/cluster/nodes/{id}/keep", n.handleKeepNode)
	mux.HandleFunc("POST /api/v1/cluster/rebalance", n.handleRebalance)
	page := status.Handler(n.Status)
	mux.Handle("GET /{$}", page)
	mux.Handle("GET /assets/", page)
	n.sinkRoutes(mux)
	n.sourceRoutes(mux)
	return errorsAsJSON(mux)
}

func (n *Node) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !n.serving.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not serving\n"))
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// handleReady is /healthz, and 503 while publishes are refused for lack
// of disk space, or while a site node has not caught up (http_cluster.go),
// with the reason: a load balancer or an operator's probe sees a node that
// takes connections but stores nothing.
func (n *Node) handleReady(w http.ResponseWriter, r *http.Request) {
	store := n.store.Load()
	if !n.serving.Load() || store == nil {
		n.handleHealth(w, r)
		return
	}
	if sp := store.Space(); sp.Refusing {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		if sp.Known && sp.Reserve >= 0 && sp.Free < uint64(sp.Reserve) {
			_, _ = fmt.Fprintf(w, "refusing publishes: %d bytes free in %s, below the %d-byte reserve (storage.min_free_bytes)\n",
				sp.Free, sp.Dir, sp.Reserve)
		} else {
			_, _ = fmt.Fprintf(w, "refusing publishes: the last write to %s found the disk full\n", sp.Dir)
		}
		return
	}
	if why := n.notCaughtUp(); why != "" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(why + "\n"))
		return
	}
	n.handleHealth(w, r)
}

func (n *Node) handleStreams(w http.ResponseWriter, _ *http.Request) {
	store := n.store.Load()
	if store == nil {
		writeError(w, http.StatusServiceUnavailable, "the log is not open")
		return
	}
	out := make([]StreamInfo, 0, len(store.Streams()))
	for _, s := range store.Streams() {
		out = append(out, streamInfo(s))
	}
	out = append(out, unlistedInfos(store)...)
	writeJSON(w, http.StatusOK, out)
}

func (n *Node) handleStream(w http.ResponseWriter, r *http.Request) {
	store := n.store.Load()
	if store == nil {
		writeError(w, http.StatusServiceUnavailable, "the log is not open")
		return
	}
	name := r.PathValue("name")
	s := store.Stream(name)
	if s == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no stream named %q", name))
		return
	}
	writeJSON(w, http.StatusOK, streamInfo(s))
}

func streamInfo(s *logstore.Stream) StreamInfo {
	filters := s.Config().Filters
	if filters == nil {
		filters = []string{}
	}
	return StreamInfo{
		Name:            s.Name(),
		Filters:         filters,
		FirstOffset:     s.FirstOffset(),
		NextOffset:      s.NextOffset(),
		CommittedOffset: s.Committed(),
		Bytes:           s.Bytes(),
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away: nothing to do
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Error: msg})
}

// errorsAsJSON turns the mux's plain-text 404 and 405 into JSON errors.
func errorsAsJSON(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&jsonStatusWriter{ResponseWriter: w, r: r}, r)
	})
}

// jsonStatusWriter replaces the plain-text body http.ServeMux writes (with
// http.Error) for a path it does not know or a method it does not allow.
// Handlers' own errors are JSON already and pass through.
type jsonStatusWriter struct {
	http.ResponseWriter
	r        *http.Request
	replaced bool
}

func (w *jsonStatusWriter) WriteHeader(status int) {
	plain := strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain")
	if !w.replaced && plain && (status == http.StatusNotFound || status == http.StatusMethodNotAllowed) {
		w.replaced = true
		w.Header().Del("X-Content-Type-Options")
		msg := fmt.Sprintf("no such endpoint: %s", w.r.URL.Path)
		if status == http.StatusMethodNotAllowed {
			msg = fmt.Sprintf("method %s not allowed on %s (allowed: %s)", w.r.Method, w.r.URL.Path, w.Header().Get("Allow"))
		}
		writeError(w.ResponseWriter, status, msg)
		return
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *jsonStatusWriter) Write(b []byte) (int, error) {
	if w.replaced {
		return len(b), nil // ServeMux's plain-text body
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *jsonStatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// slogPrinter is promhttp's error log.
type slogPrinter struct{ n *Node }

func (p slogPrinter) Println(v ...any) { p.n.log.Warn("metrics: " + fmt.Sprint(v...)) }

func (n *Node) handleStatus(w http.ResponseWriter, _ *http.Request) {
	st, err := n.Status()
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// handleGroups is the groups of the status document, with their lag in
// records and seconds.
func (n *Node) handleGroups(w http.ResponseWriter, _ *http.Request) {
	if n.store.Load() == nil || n.broker.Load() == nil {
		writeError(w, http.StatusServiceUnavailable, errNotServing.Error())
		return
	}
	writeJSON(w, http.StatusOK, n.groupStatus(time.Now(), true))
}
