package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/edge/internal/mqttclient"
	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/edge/sink/kafkasink"
	"github.com/peatmq/peat/edge/sink/mqttsink"
	"github.com/peatmq/peat/edge/sink/peatsink"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// Attribute keys of the sinks' log lines written here (edge/sink writes
// the rest, with the same keys).
const (
	attrSinkName   = "sink"
	attrStreamName = "stream"
)

// sinkSet is the node's running sinks: started after the broker, stopped
// before it.
type sinkSet struct {
	list  []*sink.Sink
	kinds map[string]string // sink name -> kind
	runners
}

// runners are the goroutines of a node's sinks or sources.
type runners struct {
	cancel  context.CancelFunc // ends their runs
	commits context.Context    // their position commits (brokerPositions)
	// endCommits gives up the position commits still waiting grace
	// after the runs were told to end.
	endCommits context.CancelFunc
	grace      time.Duration
	wg         sync.WaitGroup
}

// commitGrace is how long a node's shutdown waits for position commits
// (a sink's, a source's) still under way once their runs are told to end:
// the last acknowledged position is worth a moment, not a hung shutdown.
const commitGrace = 5 * time.Second

func newRunners() runners {
	commits, end := context.WithCancel(context.Background())
	return runners{commits: commits, endCommits: end, grace: commitGrace}
}

// stop ends the runs and waits for them, giving up their position commits
// r.grace after.
func (r *runners) stop() {
	r.cancel()
	giveUp := time.AfterFunc(r.grace, r.endCommits)
	r.wg.Wait()
	giveUp.Stop()
	r.endCommits()
}

// startSinks builds every configured sink over the open store and runs
// each on its own goroutine. A sink that cannot be built (a password file
// that cannot be read, a bad CA file) fails the start.
func (n *Node) startSinks(store *logstore.Store, broker *mqtt.Broker) error {
	if len(n.cfg.Sinks) == 0 {
		return nil
	}
	metrics := sink.NewMetrics(n.reg)
	env := sinkEnv{site: n.site.Load()}
	env.node, _ = os.Hostname()
	if env.site != nil {
		env.node = n.cfg.Cluster.NodeID
		env.siteName = n.cfg.Cluster.Name
	}
	env.sourceOrigins = n.cfg.sourceOrigins()
	set := &sinkSet{kinds: map[string]string{}, runners: newRunners()}
	env.commits = set.commits
	for i, sc := range n.cfg.Sinks {
		s, err := n.buildSink(sc, store, broker, metrics, env)
		if err != nil {
			return fmt.Errorf("sinks[%d] (%s): %w", i, sc.Name, err)
		}
		set.list = append(set.list, s)
		set.kinds[sc.Name] = "mqtt"
		if sc.Kafka != nil {
			set.kinds[sc.Name] = "kafka"
		}
		if sc.Peat != nil {
			set.kinds[sc.Name] = "peat"
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	set.cancel = cancel
	for i, s := range set.list {
		set.wg.Add(1)
		go func() { // owned by the set: stopSinks cancels and waits
			defer set.wg.Done()
			s.Run(ctx)
		}()
		var names []string // nil: every stream
		if !slices.Equal(n.cfg.Sinks[i].Streams, []string{"*"}) {
			names = n.cfg.Sinks[i].Streams
		}
		events, stop := store.Watch()
		set.wg.Add(1)
		go func() { // owned by the set, like the sink
			defer set.wg.Done()
			defer stop()
			n.followStreams(ctx, s, names, events)
		}()
	}
	n.sinks.Store(set)
	return nil
}

// followStreams keeps a sink sending the streams of names (nil: every
// stream, "*") that are added to the store while the node runs, and stops
// it sending those removed: a removed stream's series leave /metrics with
// it. The watch starts with every stream the store has; the sink already
// sends those it names.
func (n *Node) followStreams(ctx context.Context, s *sink.Sink, names []string, events <-chan logstore.StreamEvent) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if names != nil && !slices.Contains(names, ev.Stream.Name()) {
				continue
			}
			switch ev.Kind {
			case logstore.StreamAdded:
				if !n.sinkable(ev.Stream.Name()) {
					continue
				}
				if err := s.AddStream(ev.Stream); err != nil {
					n.log.Error("sink cannot follow a new stream", attrComponent, "sink", attrSinkName, s.Name(),
						attrStreamName, ev.Stream.Name(), attrErr, err)
				}
			case logstore.StreamRemoved:
				s.RemoveStream(ev.Stream.Name())
			}
		}
	}
}

// sinkable reports whether a sink of every stream ("*") sends stream: not
// a site's durable sessions (cluster.SessionsStream: state, no records).
func (n *Node) sinkable(stream string) bool {
	return !n.cfg.Cluster.Enabled() || stream != cluster.SessionsStream
}

// stopSinks stops the sinks and waits for them; their positions are
// already durable (each is committed as it moves).
func (n *Node) stopSinks() {
	set := n.sinks.Swap(nil)
	if set == nil {
		return
	}
	set.stop()
}

// sinkEnv is what the sinks of a node share: {node} in templates (the
// host name, or in a site the node id) and the site, if any.
type sinkEnv struct {
	node     string
	site     *cluster.Site
	siteName string
	// sourceOrigins are the upstreams (mqttclient.Origin) a source of
	// this node pulls from: an MQTT 5 sink to one of them marks what it
	// sends (source.PropSink), so that the source does not bring it back.
	sourceOrigins map[string]bool
	commits       context.Context // the sinks' position commits (runners)
}

func (n *Node) buildSink(sc SinkConfig, store *logstore.Store, broker *mqtt.Broker, metrics *sink.Metrics, env sinkEnv) (*sink.Sink, error) {
	var streams []sink.Stream
	if slices.Equal(sc.Streams, []string{"*"}) {
		for _, st := range store.Streams() {
			if n.sinkable(st.Name()) {
				streams = append(streams, st)
			}
		}
	} else {
		for _, name := range sc.Streams {
			st := store.Stream(name)
			if st == nil {
				return nil, fmt.Errorf("no stream named %q", name)
			}
			streams = append(streams, st)
		}
	}
	start, err := sink.ParseStart(sc.Start)
	if err != nil {
		return nil, err
	}
	up, err := buildUpstream(sc, store, env)
	if err != nil {
		return nil, err
	}
	bp := brokerPositions{broker, env.commits}
	var pos sink.Positions = bp
	var lead sink.Leadership
	if env.site != nil {
		pos = sitePositions{bp, store}
		lead = siteLeadership{env.site}
	}
	return sink.New(sink.Config{
		Name: sc.Name, Streams: streams, Filter: sc.Filter, Start: start,
		Upstream: up, Positions: pos, Leadership: lead,
		BackoffMin: time.Duration(sc.Backoff.Min), BackoffMax: time.Duration(sc.Backoff.Max),
		StallAfter: time.Duration(sc.StallAfter), MaxRate: sc.MaxRate,
		Logger: n.log.With(attrComponent, "sink"), Metrics: metrics,
	})
}

// buildUpstream reads the files a sink's upstream needs (passwords,
// certificates) and builds it.
func buildUpstream(sc SinkConfig, store *logstore.Store, env sinkEnv) (sink.Upstream, error) {
	if k := sc.Kafka; k != nil {
		return buildKafka(sc.Name, k, env)
	}
	if p := sc.Peat; p != nil {
		return buildPeat(p, store, env)
	}
	m := sc.MQTT
	mc := mqttsink.Config{
		URL: m.URL, ClientID: env.clientID(m.ClientID), Version: byte(m.Version), QoS: byte(m.QoS), Window: m.Window,
		Username: m.Username, Topic: m.Topic, Node: env.node, Properties: m.Properties,
		Keepalive: time.Duration(m.Keepalive),
	}
	if env.sourceOrigins[mqttclient.Origin(m.URL)] && m.Version == 5 {
		mark := []packets.UserProperty{{Key: source.PropSink, Val: m.ClientID}}
		mc.Extra = func(string, *logstore.Record) []packets.UserProperty { return mark }
	}
	var err error
	if m.PasswordFile != "" {
		if mc.Password, err = readPassword(m.PasswordFile); err != nil {
			return nil, fmt.Errorf("mqtt.password_file: %w", err)
		}
	}
	if mc.TLS, err = clientTLS(m.TLS); err != nil {
		return nil, fmt.Errorf("mqtt.tls: %w", err)
	}
	return mqttsink.New(mc)
}

func buildPeat(p *SinkPeatConfig, store *logstore.Store, env sinkEnv) (sink.Upstream, error) {
	pc := peatsink.Config{
		URL: p.URL, ClientID: env.clientID(p.ClientID), MirrorAs: p.MirrorAs, Topic: p.Topic, Window: p.Window,
		Username: p.Username, Node: env.node, Keepalive: time.Duration(p.Keepalive),
		First: func(name string) uint64 {
			if st := store.Stream(name); st != nil {
				return st.FirstOffset()
			}
			return 0
		},
	}
	var err error
	if p.PasswordFile != "" {
		if pc.Password, err = readPassword(p.PasswordFile); err != nil {
			return nil, fmt.Errorf("peat.password_file: %w", err)
		}
	}
	if pc.TLS, err = clientTLS(p.TLS); err != nil {
		return nil, fmt.Errorf("peat.tls: %w", err)
	}
	return peatsink.New(pc)
}

func buildKafka(name string, k *SinkKafkaConfig, env sinkEnv) (sink.Upstream, error) {
	kc := kafkasink.Config{
		Brokers: k.Brokers, Topic: k.Topic, Key: k.Key, Site: k.Site, SinkName: name, Node: env.node,
		ExactlyOnce: k.ExactlyOnce, Window: k.Window, Timeout: time.Duration(k.Timeout),
	}
	if kc.Site == "" {
		kc.Site = env.node
		if env.site != nil && reSinkName.MatchString(env.siteName) {
			// Every node of the site writes under one name, so that a
			// new leader's Resume finds what the old one wrote.
			kc.Site = env.siteName
		}
	}
	if env.site != nil {
		// Nodes leading different streams of the sink produce at once: one
		// transactional id each, or they would fence each other.
		kc.Instance = env.node
	}
	var err error
	if kc.TLS, kc.SASL, err = kafkaConn(k.TLS, k.SASL); err != nil {
		return nil, err
	}
	return kafkasink.New(kc)
}

// kafkaConn is the TLS config and SASL mechanism of a Kafka sink's or
// source's tls and sasl blocks (nil for each that is off).
func kafkaConn(t SinkKafkaTLSConfig, sa SinkKafkaSASLConfig) (*tls.Config, sasl.Mechanism, error) {
	var tc *tls.Config
	if t.Enabled {
		var err error
		if tc, err = clientTLS(t.SinkTLSConfig); err != nil {
			return nil, nil, fmt.Errorf("kafka.tls: %w", err)
		}
	}
	if sa.Mechanism == "" {
		return tc, nil, nil
	}
	pass, err := readPassword(sa.PasswordFile)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka.sasl.password_file: %w", err)
	}
	switch sa.Mechanism {
	case "plain":
		return tc, plain.Auth{User: sa.Username, Pass: pass}.AsMechanism(), nil
	case "scram-sha-256":
		return tc, scram.Auth{User: sa.Username, Pass: pass}.AsSha256Mechanism(), nil
	case "scram-sha-512":
		return tc, scram.Auth{User: sa.Username, Pass: pass}.AsSha512Mechanism(), nil
	}
	return nil, nil, fmt.Errorf("kafka.sasl.mechanism %q", sa.Mechanism)
}

// readPassword is a password file's first line.
func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimRight(line, "\r"), nil
}

// clientTLS is the TLS client config of a tls block: the system roots
// unless ca_file is set.
func clientTLS(t SinkTLSConfig) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s: no PEM certificate in it", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("cert_file, key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// sinkRoutes adds the sinks' API to the node's mux.
func (n *Node) sinkRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/sinks", n.handleSinks)
	mux.HandleFunc("GET /api/v1/sinks/{name}", n.handleSink)
	mux.HandleFunc("POST /api/v1/sinks/{name}/pause", n.handleSinkPause(true))
	mux.HandleFunc("POST /api/v1/sinks/{name}/resume", n.handleSinkPause(false))
	mux.HandleFunc("POST /api/v1/sinks/{name}/seek", n.handleSinkSeek)
}

func (n *Node) handleSinks(w http.ResponseWriter, _ *http.Request) {
	out := []sink.Status{}
	if set := n.sinks.Load(); set != nil {
		for _, s := range set.list {
			out = append(out, set.status(s))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (set *sinkSet) status(s *sink.Sink) sink.Status {
	st := s.Status()
	st.Kind = set.kinds[s.Name()]
	return st
}

// sinkNamed finds a sink for a handler, or writes the 404.
func (n *Node) sinkNamed(w http.ResponseWriter, r *http.Request) (*sinkSet, *sink.Sink) {
	name := r.PathValue("name")
	if set := n.sinks.Load(); set != nil {
		for _, s := range set.list {
			if s.Name() == name {
				return set, s
			}
		}
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no sink named %q", name))
	return nil, nil
}

func (n *Node) handleSink(w http.ResponseWriter, r *http.Request) {
	if set, s := n.sinkNamed(w, r); s != nil {
		writeJSON(w, http.StatusOK, set.status(s))
	}
}

// handleSinkPause pauses or resumes a sink until the node restarts.
func (n *Node) handleSinkPause(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		set, s := n.sinkNamed(w, r)
		if s == nil {
			return
		}
		if pause {
			s.Pause()
		} else {
			s.Resume()
		}
		writeJSON(w, http.StatusOK, set.status(s))
	}
}
