package edge

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/peatmq/peat/edge/mirror"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/source/peatsource"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// sourceSet is the node's running sources: started after the broker,
// stopped before it (and before the sinks).
type sourceSet struct {
	list []*source.Source
	runners
}

// sourceEnv is what the sources of a node share.
type sourceEnv struct {
	maxPayload int // mqtt.max_payload_bytes: the largest message stored
	// sinkIDs are the client ids of this node's MQTT 5 sinks by upstream:
	// a source drops what comes back down marked with one of them.
	sinkIDs map[string][]string
	logger  *slog.Logger
}

// sourceLog is the broker's log as a source finds its stream in it: in a
// site the cluster's, so that an append on the stream's leader is
// replicated to its ISR before it counts as committed.
type sourceLog struct {
	l     mqtt.Log
	store *logstore.Store
}

func (l sourceLog) Stream(name string) source.Stream {
	st := l.l.Stream(name)
	if st == nil {
		return nil
	}
	if local := l.store.Stream(name); local != nil {
		return endStream{st, local}
	}
	return st
}

// endStream is a stream of the broker's log that knows the end of this
// node's copy (source.LogEnder): a new leader's holds records its
// predecessor appended before its watermark covers them.
type endStream struct {
	mqtt.Stream
	local *logstore.Stream
}

func (s endStream) LogEnd() uint64 { return s.local.NextOffset() }

func (l sourceLog) Route(topic string) string {
	if st := l.l.Route(topic); st != nil {
		return st.Name()
	}
	return ""
}

// startSources builds every configured source and runs each on its own
// goroutine. A source that cannot be built (a password file that cannot
// be read, a bad CA file) fails the start.
func (n *Node) startSources(log mqtt.Log, store *logstore.Store, broker *mqtt.Broker) error {
	if len(n.cfg.Sources) == 0 {
		return nil
	}
	metrics := source.NewMetrics(n.reg)
	env := sourceEnv{maxPayload: n.cfg.BrokerConfig().MaxPayload, sinkIDs: n.cfg.sinkIDs(), logger: n.log.With(attrComponent, "source")}
	set := &sourceSet{runners: newRunners()}
	bp := brokerPositions{broker, set.commits}
	var marks source.Positions = bp
	var lead source.Leadership
	if site := n.site.Load(); site != nil {
		marks = sitePositions{bp, store}
		lead = siteLeadership{site}
	}
	for i, sc := range n.cfg.Sources {
		stream, err := n.cfg.sourceStream(sc)
		if err != nil {
			return fmt.Errorf("sources[%d] (%s): %w", i, sc.Name, err)
		}
		k := sc.kinds()[0]
		up, err := k.upstream(sc, env)
		if err != nil {
			return fmt.Errorf("sources[%d] (%s): %w", i, sc.Name, err)
		}
		var sl source.Log = sourceLog{log, store}
		if sc.Peat != nil {
			sl = peatsource.MirrorLog(sl, stream, n.mirrorApply(store), env.logger)
		}
		s, err := source.New(source.Config{
			Name: sc.Name, Kind: k.kind(), Stream: stream, Log: sl, Upstream: up,
			Marks: marks, Leadership: lead,
			BackoffMin: time.Duration(sc.Backoff.Min), BackoffMax: time.Duration(sc.Backoff.Max),
			StallAfter: time.Duration(sc.StallAfter),
			Logger:     n.log.With(attrComponent, "source"), Metrics: metrics,
		})
		if err != nil {
			return fmt.Errorf("sources[%d] (%s): %w", i, sc.Name, err)
		}
		set.list = append(set.list, s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	set.cancel = cancel
	for _, s := range set.list {
		set.wg.Go(func() { s.Run(ctx) }) // owned by the set: stopSources cancels and waits
	}
	n.sources.Store(set)
	return nil
}

// mirrorApply writes into a mirror stream by the mirror rules: through
// the mirror stream's leader in a site, into the store on a single node.
func (n *Node) mirrorApply(store *logstore.Store) peatsource.Apply {
	if site := n.site.Load(); site != nil {
		return site.Log.Mirror
	}
	return func(ctx context.Context, stream string, in []mirror.Incoming) ([]mirror.Result, []error) {
		st := store.Stream(stream)
		if st == nil {
			res, errs := make([]mirror.Result, len(in)), make([]error, len(in))
			for i := range in {
				res[i], errs[i] = mirror.Refused, fmt.Errorf("%s: %w", stream, mirror.ErrNotMirror)
			}
			return res, errs
		}
		return mirror.Apply(ctx, st, 0, in)
	}
}

// stopSources stops the sources and waits for them: what they received
// and did not make durable is not acknowledged, so the upstream keeps it.
func (n *Node) stopSources() {
	set := n.sources.Swap(nil)
	if set == nil {
		return
	}
	set.stop()
}

// sourceRoutes adds the sources' API to the node's mux.
func (n *Node) sourceRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/sources", n.handleSources)
	mux.HandleFunc("GET /api/v1/sources/{name}", n.handleSource)
	mux.HandleFunc("POST /api/v1/sources/{name}/pause", n.handleSourcePause(true))
	mux.HandleFunc("POST /api/v1/sources/{name}/resume", n.handleSourcePause(false))
}

// sourceStatuses are the sources as the API shows them.
func (n *Node) sourceStatuses() []source.Status {
	out := []source.Status{}
	if set := n.sources.Load(); set != nil {
		for _, s := range set.list {
			out = append(out, s.Status())
		}
	}
	return out
}

func (n *Node) handleSources(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, n.sourceStatuses())
}

// sourceNamed finds a source for a handler, or writes the 404.
func (n *Node) sourceNamed(w http.ResponseWriter, r *http.Request) *source.Source {
	name := r.PathValue("name")
	if set := n.sources.Load(); set != nil {
		for _, s := range set.list {
			if s.Name() == name {
				return s
			}
		}
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no source named %q", name))
	return nil
}

func (n *Node) handleSource(w http.ResponseWriter, r *http.Request) {
	if s := n.sourceNamed(w, r); s != nil {
		writeJSON(w, http.StatusOK, s.Status())
	}
}

// handleSourcePause pauses or resumes a source until the node restarts.
// Paused, the source is disconnected; the upstream's session keeps what
// arrives meanwhile.
func (n *Node) handleSourcePause(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := n.sourceNamed(w, r)
		if s == nil {
			return
		}
		if pause {
			s.Pause()
		} else {
			s.Resume()
		}
		writeJSON(w, http.StatusOK, s.Status())
	}
}
