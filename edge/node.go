package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/edge/auth"
	"github.com/peatmq/peat/edge/mirror"
	"github.com/peatmq/peat/edge/status"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// Attribute keys of the node's log lines.
const (
	attrMQTT       = "mqtt" // bound MQTT address; scripts and tests read it from "node serving"
	attrHTTP       = "http" // bound HTTP address
	attrComponent  = "component"
	attrGoMemLim   = "GOMEMLIMIT"
	attrDataDir    = "data_dir"
	attrProfile    = "profile"
	attrLimit      = "memory_limit_bytes"
	attrProcs      = "GOMAXPROCS"
	attrWas        = "was"
	attrStreams    = "streams"
	attrErr        = "err"
	attrFree       = "free_bytes"
	attrReserve    = "reserve_bytes"
	attrFSSize     = "filesystem_bytes"
	attrMaxPayload = "max_payload_bytes"
	attrMaxRecord  = "max_record_bytes"
)

// Node is one running Peat node: the log, the MQTT front-end and the HTTP
// server.
type Node struct {
	cfg Config
	log *slog.Logger
	reg *prometheus.Registry

	storeMetrics *logstore.Metrics
	mqttMetrics  *mqtt.Metrics

	serving atomic.Bool                    // /healthz says ok
	store   atomic.Pointer[logstore.Store] // what HTTP handlers and metrics read; nil when closed
	sinks   atomic.Pointer[sinkSet]        // upstream sinks (sinks.go); nil when none run
	sources atomic.Pointer[sourceSet]      // upstream sources (sources.go); nil when none run
	broker  atomic.Pointer[mqtt.Broker]    // the same for the broker
	site    atomic.Pointer[cluster.Site]   // the node's part in its site; nil outside a cluster
	build   atomic.Pointer[Build]          // SetBuild
	started time.Time                      // set by Start, before HTTP serves
	history *status.Ring                   // the sampler's readings (statusdoc.go)

	// Security (node_auth.go, http_auth.go).
	auth       atomic.Pointer[auth.Auth]   // nil without auth files
	tokens     atomic.Pointer[auth.Tokens] // nil without http.tokens_file
	httpDenied *prometheus.CounterVec      // peat_http_denied_total{reason}
	keyPairs   keyPairs                    // TLS certificates Reload reads again

	// freeSpace replaces statfs for the log's free-space check (tests).
	freeSpace func(dir string) (free, size uint64, err error)

	// mu guards the lifecycle: what Start opened is what Close closes.
	mu struct {
		sync.Mutex
		started, closed bool
		closeErr        error
		store           *logstore.Store
		broker          *mqtt.Broker
		site            *cluster.Site // nil outside a cluster
		mirror          *mirror.Hook  // nil without mirror streams
		http            *http.Server
		httpAddr        net.Addr
		httpDone        chan struct{} // closed when the HTTP serve goroutine returns
		prevMemLimit    int64         // -1: the node did not set a memory limit
		prevProcs       int           // 0: the node did not set GOMAXPROCS
		stopSampler     func()        // stops the sampler and waits for it; nil when not started
	}
}

// New checks cfg and prepares a node; it opens nothing. logger may be nil
// (no logging).
func New(cfg Config, logger *slog.Logger) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	n := &Node{
		cfg:          cfg,
		log:          logger,
		reg:          reg,
		storeMetrics: logstore.NewMetrics(reg),
		mqttMetrics:  mqtt.NewMetrics(reg),
		history:      status.NewRing(historySamples),
		httpDenied:   newHTTPDenied(reg),
	}
	reg.MustRegister(nodeCollector{n}, cluster.NewCollector(n.site.Load))
	n.mu.prevMemLimit = -1
	return n, nil
}

// Registry is the node's Prometheus registry, served on /metrics.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// Start applies the memory limit, opens the log, starts the MQTT broker and
// the HTTP server. On error everything it opened is closed again, and the
// node cannot be started again.
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.mu.closed:
		return ErrClosed
	case n.mu.started:
		return ErrStarted
	}
	n.mu.started = true
	if err := n.start(ctx); err != nil {
		n.mu.closed = true
		n.mu.closeErr = n.shutdown(context.Background())
		return err
	}
	n.serving.Store(true)
	n.log.Info("node serving", attrMQTT, n.mu.broker.Addr().String(), attrHTTP, addrString(n.mu.httpAddr),
		attrDataDir, n.cfg.DataDir, attrProfile, string(n.cfg.Profile()))
	return nil
}

// start does Start's work; n.mu is held. What it opened is recorded in n.mu
// as soon as it is open, so shutdown can undo a partial start.
func (n *Node) start(ctx context.Context) error {
	profile := n.cfg.Profile()
	n.applyMemoryLimit(profile)
	n.started = time.Now()

	if err := ctx.Err(); err != nil {
		return err
	}
	sc := n.cfg.StoreConfig()
	sc.Logger = n.log.With(attrComponent, "logstore")
	sc.Metrics = n.storeMetrics
	sc.FreeSpace = n.freeSpace
	store, err := logstore.Open(sc)
	if err != nil {
		return fmt.Errorf("open log in %s: %w", n.cfg.DataDir, err)
	}
	n.mu.store = store
	n.store.Store(store)
	streams := make([]string, 0, len(store.Streams()))
	for _, s := range store.Streams() {
		streams = append(streams, s.Name())
	}
	n.log.Info("log open", attrDataDir, n.cfg.DataDir, attrProfile, string(profile), attrStreams, streams)
	n.logUnlisted(store)
	n.warnLowSpace(store.Space())
	n.warnPayloadAboveRecord(n.cfg.BrokerConfig().MaxPayload, store.MaxRecordBytes())
	n.warnLooseFiles() // filemodes.go
	n.applyProcs(store.CommitsWaitForFsync())

	if err := ctx.Err(); err != nil {
		return err
	}
	// Bind HTTP before MQTT: a port clash is found before clients connect.
	if n.cfg.HTTP.Listen != "" {
		ln, err := n.httpListen() // http_auth.go: TLS and tokens
		if err != nil {
			return err
		}
		n.mu.httpAddr = ln.Addr()
		n.mu.http = &http.Server{
			Handler:           n.protect(n.Handler()),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(n.log.Handler(), slog.LevelWarn),
		}
		n.mu.httpDone = make(chan struct{})
		go n.serveHTTP(n.mu.http, ln, n.mu.httpDone)
	}

	bc := n.cfg.BrokerConfig()
	bc.Logger = n.log.With(attrComponent, "mqtt")
	bc.Metrics = n.mqttMetrics
	if err := n.secureBroker(&bc); err != nil {
		return err
	}
	n.logAuth()
	var log mqtt.Log = storeLog{store}
	if n.cfg.Cluster.Enabled() {
		if log, err = n.startSite(store); err != nil {
			return err
		}
	}
	broker, err := mqtt.New(bc, log)
	if err != nil {
		return fmt.Errorf("set up MQTT: %w", err)
	}
	n.mu.broker = broker
	if n.cfg.hasMirrors() {
		var site mirror.Site // in a site, through the mirror stream's leader
		if n.mu.site != nil {
			site = n.mu.site.Log
		}
		h, err := mirror.NewHook(store, site, n.log.With(attrComponent, "mirror"), n.reg)
		if err != nil {
			return fmt.Errorf("set up mirror streams: %w", err)
		}
		n.mu.mirror = h
		if err := broker.Server().AddHook(h, nil); err != nil {
			return fmt.Errorf("set up mirror streams: %w", err)
		}
	}
	if err := broker.Start(); err != nil {
		return fmt.Errorf("start MQTT: %w", err) // the error names the address
	}
	n.broker.Store(broker)

	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go n.sampleLoop(sctx, done)
	n.mu.stopSampler = func() { cancel(); <-done }
	if err := n.startSinks(store, broker); err != nil {
		return err
	}
	return n.startSources(log, store, broker)
}

// warnPayloadAboveRecord warns at start when mqtt.max_payload_bytes lets in
// payloads larger than the storage profile can store in one record (a
// value-log file, logstore.Store.MaxRecordBytes): such publishes pass the
// MQTT check and are then refused by the log, one by one.
func (n *Node) warnPayloadAboveRecord(maxPayload, maxRecord int) {
	// A record holds its topic, properties and client id beside the payload.
	const recordOverhead = 64 << 10
	if maxPayload > maxRecord-recordOverhead {
		n.log.Warn("mqtt.max_payload_bytes is above the largest record this storage profile stores; larger publishes are refused (MQTT 5: 0x97)",
			attrMaxPayload, maxPayload, attrMaxRecord, maxRecord)
	}
}

// warnLowSpace warns at start when the log's filesystem has less than
// twice the free-space reserve: below it every publish is refused (MQTT 5
// reason 0x97), and a node that starts there would otherwise refuse them
// with nothing in its log to say why.
func (n *Node) warnLowSpace(sp logstore.SpaceStatus) {
	if !sp.Known || sp.Reserve < 0 {
		return
	}
	attrs := []any{attrDataDir, n.cfg.DataDir, attrFree, sp.Free, attrReserve, sp.Reserve, attrFSSize, sp.Size}
	switch {
	case sp.Free < uint64(sp.Reserve):
		n.log.Warn("disk space below the reserve: every publish is refused until space is freed (storage.min_free_bytes)", attrs...)
	case sp.Free < 2*uint64(sp.Reserve):
		n.log.Warn("disk space near the reserve: publishes are refused once free space falls below it (storage.min_free_bytes)", attrs...)
	}
}

// serveHTTP is the HTTP server's goroutine; Close stops it and waits on done.
func (n *Node) serveHTTP(srv *http.Server, ln net.Listener, done chan struct{}) {
	defer close(done)
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		n.log.Error("HTTP server stopped", attrErr, err)
	}
}

// applyMemoryLimit sets the Go runtime's soft memory limit to the storage
// profile's, unless the operator set GOMEMLIMIT.
func (n *Node) applyMemoryLimit(p logstore.Profile) {
	limit := p.MemoryLimit()
	if limit <= 0 {
		return
	}
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		n.log.Info("memory limit left to GOMEMLIMIT", attrGoMemLim, v, attrProfile, string(p))
		return
	}
	n.mu.prevMemLimit = debug.SetMemoryLimit(limit)
	n.log.Info("memory limit set", attrProfile, string(p), attrLimit, limit)
}

// minProcsForFsync is the fewest Ps (GOMAXPROCS) a node runs with when its
// group commits wait for fsync.
const minProcsForFsync = 2

// applyProcs gives the Go scheduler a second P on a node that may run on
// one CPU only (a single core, or pinned with taskset) and whose commits
// wait for fsync, unless the operator set GOMAXPROCS. (A cgroup CPU limit
// below 2 already gets 2 Ps: Go's default rounds it up.)
//
// A group commit blocks its thread in two syncs of 0.3-1 ms each (Badger
// msyncs the value log, then the memtable log). With one P, Go hands the P
// to another thread only once sysmon notices the blocked system call (20
// µs or more later), and when the sync returns the committing goroutine
// finds its P gone and, under load, waits in the global run queue behind
// whatever runs meanwhile; every acknowledgement of the commit waits with
// it. With a second P, the other
// P serves clients while a commit blocks. Measured with the broker pinned
// to one CPU (2026-12-03, 7 alternating runs each): QoS 1 fan-in with
// fsync (W2 of scripts/bench.sh) delivered a median 1.06x plain mochi's
// rate instead of 0.87x; 1,000 sensors each publishing alone with fsync
// (W6) cost 10% more CPU per message. Where commits do not block
// (interval), the second P only adds thread wake-ups: W2 lost a quarter of
// its rate and used two fifths more CPU per message, so those nodes keep
// one.
func (n *Node) applyProcs(fsyncCommits bool) {
	procs := runtime.GOMAXPROCS(0)
	if !fsyncCommits || procs >= minProcsForFsync {
		return
	}
	if v, ok := os.LookupEnv("GOMAXPROCS"); ok {
		n.log.Info("GOMAXPROCS left as set", attrProcs, v)
		return
	}
	n.mu.prevProcs = runtime.GOMAXPROCS(minProcsForFsync)
	n.log.Info("GOMAXPROCS raised: commits wait for fsync", attrProcs, minProcsForFsync, attrWas, procs)
}

// Close stops the HTTP server, the MQTT broker (no new connections or
// publishes) and then closes the log. It returns when all is closed or ctx
// is done; calling it again returns the first call's result.
func (n *Node) Close(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.mu.closed {
		return n.mu.closeErr
	}
	n.mu.closed = true
	n.mu.closeErr = n.shutdown(ctx)
	return n.mu.closeErr
}

// shutdown closes whatever is open, in order; n.mu is held.
func (n *Node) shutdown(ctx context.Context) error {
	n.serving.Store(false)
	var errs []error
	if n.mu.http != nil {
		if err := n.mu.http.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop HTTP: %w", err))
			_ = n.mu.http.Close()
		}
		<-n.mu.httpDone
	}
	n.stopSources()
	n.stopSinks()
	if n.mu.stopSampler != nil {
		n.mu.stopSampler()
		n.mu.stopSampler = nil
	}
	n.broker.Store(nil)
	if n.mu.broker != nil {
		if err := n.mu.broker.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop MQTT: %w", err))
		}
	}
	if n.mu.mirror != nil {
		_ = n.mu.mirror.Stop() // mochi stops it too, unless its close timed out
	}
	if err := n.stopSite(); err != nil {
		errs = append(errs, err)
	}
	if n.mu.store != nil {
		n.store.Store(nil)
		if err := n.mu.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close log: %w", err))
		}
	}
	if n.mu.prevMemLimit >= 0 {
		debug.SetMemoryLimit(n.mu.prevMemLimit)
		n.mu.prevMemLimit = -1
	}
	if n.mu.prevProcs > 0 {
		runtime.GOMAXPROCS(n.mu.prevProcs)
		n.mu.prevProcs = 0
	}
	return errors.Join(errs...)
}

// MQTTAddr is the first MQTT listener's address, nil before Start and
// after Close.
func (n *Node) MQTTAddr() net.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.mu.broker == nil || n.mu.closed {
		return nil
	}
	return n.mu.broker.Addr()
}

// MQTTListenerAddr is the address of the MQTT listener named name
// (mqtt.listeners[].name; "mqtt" for mqtt.listen), nil when there is
// none, before Start and after Close.
func (n *Node) MQTTListenerAddr(name string) net.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.mu.broker == nil || n.mu.closed {
		return nil
	}
	return n.mu.broker.ListenerAddr(name)
}

// HTTPAddr is the HTTP listener's address, nil before Start, after Close,
// or when HTTP is disabled.
func (n *Node) HTTPAddr() net.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.mu.closed {
		return nil
	}
	return n.mu.httpAddr
}

// Store is the node's log, nil before Start and after Close.
func (n *Node) Store() *logstore.Store {
	return n.store.Load()
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}
