package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// The Log.
//
// Log is mqtt.Log on one node. Its streams are those of the node's store
// that the controller's state holds; one goroutine follows both (a stream
// created through the controller, added to or removed from the store
// comes or goes at run time, with mqtt's StreamEvents). A node outside a
// stream's replicas is an observer of it: its Replicator runs a Fetcher
// as on a follower, so its clients read the stream there and its
// producers are forwarded, but the leader never counts it (rules.ProposeISR
// takes replicas only, and the watermark is the ISR's). Filters, and so routing,
// come from the store's stream configuration: the state names replicas,
// not topics.

// Log is the site's log as the MQTT front-end of one node sees it: the
// streams the controller's state holds with this node among their
// replicas, on this node's store (opened with ManualCommit) and run by
// its Replicator. An append is taken on the stream's leader, from a
// producer there or forwarded by another replica, and answered once the
// high watermark has passed it (acks=all) or once written (acks=leader);
// reads serve committed records on every replica. Consumer state is
// written through the leader and replicated to the ISR
// (log_state_leader.go).
//
// One goroutine, started by NewLog and stopped by Close, follows the
// state and the store's streams; each visible stream has one more that
// answers its appends and forwards its Changed.
type Log struct {
	node  *Node
	store *logstore.Store
	rep   *Replicator
	log   *slog.Logger
	cfg   LogConfig

	view atomic.Pointer[logView] // what Route, Streams and Stream answer
	// taken is mqtt's OnSessionTaken, orphaned its OnSessionsOrphaned
	// (log_sessions.go, log_sessions_orphaned.go).
	taken    atomic.Pointer[func(id string)]
	orphaned atomic.Pointer[func(ids []string)]
	stop     chan struct{}
	done     chan struct{}

	mu struct {
		sync.Mutex
		watchers map[*watcher]struct{}
		closed   bool
	}
}

// logView is one immutable set of visible streams, and the sessions'
// stream (log_sessions.go), which mqtt does not see as a stream.
type logView struct {
	streams  []*stream // Streams order
	byName   map[string]*stream
	router   *logstore.Router
	sessions *stream // nil until the state and the store have it
}

var _ mqtt.Log = (*Log)(nil)

// LogConfig is what a Log takes besides the node's parts.
type LogConfig struct {
	Log *slog.Logger // nil: discard
	// AcksLeader, when set and true for a stream, makes the stream
	// acks=leader: its leader answers an append (a forwarded one too)
	// and a consumer-state write once written locally, without waiting
	// for the ISR, and min_insync_replicas does not refuse them. A
	// leader's death can then lose what it answered. nil: every stream
	// is acks=all.
	AcksLeader func(stream string) bool
	// Mirror applies the mirror rules (edge/mirror.Apply) on a mirror
	// stream's leader (Log.Mirror); nil: mirror appends are refused.
	Mirror MirrorApply
	// ForwardTimeout is how long an append a follower forwarded may go
	// unanswered by the leader once sent: then the connection is dropped,
	// the appends unanswered on it are refused as of unknown fate (the
	// producer is told to publish again), and the next go on a new
	// connection (forward.go). 0: the node's SessionTimeout and a second
	// (DefaultForwardTimeout, 4 s, by default).
	ForwardTimeout time.Duration
	// probeAfter and probeWait replace cutOffProbeAfter and
	// cutOffProbeWait in this package's tests.
	probeAfter, probeWait time.Duration
	// stateFetchTimeout replaces DefaultFetchTimeout for state fetches in
	// this package's tests.
	stateFetchTimeout time.Duration
}

// NewLog is NewLogConfig with a logger alone: every stream acks=all.
func NewLog(node *Node, store *logstore.Store, rep *Replicator, log *slog.Logger) *Log {
	return NewLogConfig(node, store, rep, LogConfig{Log: log})
}

// NewLogConfig serves store's streams as the controller's state and rep
// (this node's Replicator, over the same store) have them, and answers
// the other replicas' forwarded appends, state writes, state fetches and
// claims through rep's Server. Close it before rep and the store.
func NewLogConfig(node *Node, store *logstore.Store, rep *Replicator, cfg LogConfig) *Log {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Log{node: node, store: store, rep: rep, log: log, cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
	l.mu.watchers = map[*watcher]struct{}{}
	l.view.Store(&logView{byName: map[string]*stream{}, router: mustRouter(nil)})
	st, _ := node.State()
	l.refresh(st) // the streams known now are there when NewLog returns
	if rep.cfg.Server != nil {
		rep.cfg.Server.serveLog(l)
	}
	go l.run()
	return l
}

func (l *Log) acksLeader(stream string) bool {
	return l.cfg.AcksLeader != nil && l.cfg.AcksLeader(stream)
}

// drainAcksLeader drains (Leader.Drain), all at once and each for at
// most wait, every acks: leader stream this node leads with another ISR
// member, records then consumer state (replState.drain), and returns those
// whose ISR may still lack what this node acknowledged. Under acks=all
// every acknowledged record and state write is in the ISR already:
// nothing to wait for.
func (l *Log) drainAcksLeader(ctx context.Context, wait time.Duration) (behind []string) {
	self := l.node.ID()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, cs := range l.node.View().Streams {
		ld, _ := l.rep.Leading(name)
		if ld == nil || cs.Leader != self || len(cs.ISR) < 2 || !l.acksLeader(name) {
			continue
		}
		wg.Go(func() {
			// With the records held the state may still lag: no shrink
			// then, it counts records only.
			records, drained := l.drain(ctx, name, ld, wait)
			if !records {
				drained = l.keepHolders(ctx, name, ld)
			}
			if !drained {
				mu.Lock()
				behind = append(behind, name)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(behind)
	return behind
}

// drain drains stream name, which ld leads, for at most wait: records
// (Leader.Drain), then consumer state (replState.drain). records reports
// whether every ISR member holds ld's records, held whether it holds its
// state writes too.
func (l *Log) drain(ctx context.Context, name string, ld *Leader, wait time.Duration) (records, held bool) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if !ld.Drain(ctx) {
		return false, false
	}
	s := l.stream(name)
	return true, s == nil || s.rs.drain(ctx, ld)
}

// keepHolders shrinks the ISR of stream name, which ld leads and has
// drained, to the followers that hold all of its log, when some do and
// others do not: the controller elects the first ISR member in replica
// order, which could otherwise be one that lacks acknowledged records (a
// follower that stopped fetching stays in the ISR for the session timeout).
// It reports whether the ISR then holds only such followers.
func (l *Log) keepHolders(ctx context.Context, name string, ld *Leader) bool {
	self := l.node.ID()
	for {
		st, changed := l.node.State()
		cs, me := st.Streams[name], st.Brokers[self]
		if cs == nil || me == nil || cs.Leader != self || cs.LeaderEpoch != ld.epoch {
			return false // no longer this leadership's to decide
		}
		isr := []rules.ISRMember{{ID: self, Epoch: me.Epoch}}
		for _, m := range ld.holdingAll() {
			if cs.InISR(m.ID) {
				isr = append(isr, m)
			}
		}
		switch {
		case len(isr) == len(cs.ISR):
			return true // every member caught up meanwhile
		case len(isr) == 1:
			return false // none holds it all: the election takes what there is
		}
		err := l.node.Submit(ctx, rules.AlterISR{Name: name, Leader: self, LeaderEpoch: cs.LeaderEpoch, Version: cs.Version, ISR: isr})
		if !errors.Is(err, ErrStaleVersion) { // the Replicator's own ISR change came first: look again
			if err != nil {
				l.log.Warn("cluster: hand-over: ISR not shrunk to the followers holding every record",
					slog.String("stream", name), slog.Any("err", err))
			}
			return err == nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

func mustRouter(filters [][]string) *logstore.Router {
	r, err := logstore.NewRouter(filters)
	if err != nil { // the store has refused such filters already
		r, _ = logstore.NewRouter(nil)
	}
	return r
}

// run follows the controller's state and the store's streams.
func (l *Log) run() {
	defer close(l.done)
	events, cancel := l.store.Watch()
	defer cancel()
	for {
		st, changed := l.node.State()
		l.refresh(st)
		select {
		case <-l.stop:
			return
		case <-changed:
		case _, ok := <-events:
			if !ok {
				events = nil
			}
		}
	}
}

// refresh makes the visible streams those of the store that st has (this
// node a replica or an observer): streams already visible keep their place, new
// ones follow in the store's order. A stream leaving is closed before its
// Removed event is queued.
func (l *Log) refresh(st *rules.State) {
	old := l.view.Load()
	var want []*logstore.Stream
	var sys *logstore.Stream
	for _, s := range l.store.Streams() {
		// A replica, or an observer (Replicator.want), holding the
		// stream's records, not a deleted one's (delete.go).
		if cs := st.Streams[s.Name()]; cs == nil || !servesIncarnation(s, cs, st) {
			continue
		} else if s.Name() == SessionsStream {
			sys = s
		} else {
			want = append(want, s)
		}
	}
	sessions := old.sessions
	var sysGone *stream
	if sessions != nil && sessions.st != sys {
		sysGone, sessions = sessions, nil
	}
	if sessions == nil && sys != nil {
		sessions = newStream(l, sys)
	}
	keep := map[*logstore.Stream]bool{}
	for _, s := range want {
		keep[s] = true
	}
	var next []*stream
	var events []mqtt.StreamEvent
	var gone []*stream
	for _, s := range old.streams {
		if keep[s.st] {
			next = append(next, s)
			delete(keep, s.st)
		} else {
			gone = append(gone, s)
		}
	}
	for _, s := range want {
		if keep[s] {
			ns := newStream(l, s)
			next = append(next, ns)
			events = append(events, mqtt.StreamEvent{Kind: logstore.StreamAdded, Stream: ns})
		}
	}
	if len(gone) == 0 && len(events) == 0 && sessions == old.sessions {
		return
	}
	for _, s := range gone {
		s.close()
		events = append(events, mqtt.StreamEvent{Kind: logstore.StreamRemoved, Stream: s})
	}
	if sysGone != nil {
		sysGone.close()
		gone = append(gone, sysGone)
	}
	v := &logView{streams: next, byName: map[string]*stream{}, sessions: sessions}
	filters := make([][]string, len(next))
	for i, s := range next {
		v.byName[s.name] = s
		filters[i] = s.st.Filters()
	}
	v.router = mustRouter(filters)
	l.mu.Lock()
	l.view.Store(v) // Close, after run ends, closes what this publishes
	for w := range l.mu.watchers {
		w.push(events...)
	}
	l.mu.Unlock()
	for _, s := range gone {
		<-s.done
	}
}

// Route returns the visible stream capturing topic, or a nil interface.
func (l *Log) Route(topic string) mqtt.Stream {
	v := l.view.Load()
	if i := v.router.Route(topic); i >= 0 {
		return v.streams[i]
	}
	return nil
}

// Streams lists the visible streams.
func (l *Log) Streams() []mqtt.Stream {
	v := l.view.Load()
	out := make([]mqtt.Stream, len(v.streams))
	for i, s := range v.streams {
		out[i] = s
	}
	return out
}

// Stream returns the named visible stream, or a nil interface.
func (l *Log) Stream(name string) mqtt.Stream {
	if s := l.view.Load().byName[name]; s != nil {
		return s
	}
	return nil
}

// stream is the named stream, the sessions' stream too (the Server
// answers for it), or nil.
func (l *Log) stream(name string) *stream {
	v := l.view.Load()
	if name == SessionsStream {
		return v.sessions
	}
	return v.byName[name]
}

// State is this node's own state (retained indexes of older layouts,
// what mqtt migrates): it is not replicated. Durable sessions are the
// site's (SessionState, log_sessions.go).
func (l *Log) State() mqtt.StateStore { return logState{l} }

// StreamStateShared is true: every node of the site shares a stream's
// state (its sessions' offsets among them), and a node knows only the
// sessions of its own clients, so mqtt must not delete the offsets of
// sessions it does not know (mqtt.SharedState).
func (l *Log) StreamStateShared() bool { return true }

var _ mqtt.SharedState = (*Log)(nil)

type logState struct{ l *Log }

func (s logState) WriteState(puts map[string][]byte, dels []string) error {
	if s.l.isClosed() {
		return fmt.Errorf("cluster: write state: %w", logstore.ErrClosed)
	}
	return s.l.store.WriteState(puts, dels)
}

func (s logState) LoadState(prefix string, fn func(key string, val []byte) error) error {
	if s.l.isClosed() {
		return fmt.Errorf("cluster: load state: %w", logstore.ErrClosed)
	}
	return s.l.store.LoadState(prefix, fn)
}

func (l *Log) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.closed
}

// WatchStreams follows the visible streams (mqtt.Log's promises).
func (l *Log) WatchStreams() (<-chan mqtt.StreamEvent, func()) {
	w := newWatcher()
	l.mu.Lock()
	if l.mu.closed {
		l.mu.Unlock()
		w.cancel()
		return w.out, w.cancel
	}
	for _, s := range l.view.Load().streams {
		w.push(mqtt.StreamEvent{Kind: logstore.StreamAdded, Stream: s})
	}
	l.mu.watchers[w] = struct{}{}
	l.mu.Unlock()
	return w.out, func() {
		l.mu.Lock()
		delete(l.mu.watchers, w)
		l.mu.Unlock()
		w.cancel()
	}
}

// Close stops following the state, closes every visible stream (their
// queued appends are answered) and every watcher; idempotent. It closes
// neither the Replicator nor the store.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.mu.closed {
		l.mu.Unlock()
		return nil
	}
	l.mu.closed = true
	ws := l.mu.watchers
	l.mu.watchers = nil
	l.mu.Unlock()
	if l.rep.cfg.Server != nil {
		l.rep.cfg.Server.serveLog(nil)
	}
	close(l.stop)
	<-l.done
	v := l.view.Load()
	for _, s := range v.streams {
		s.close()
		<-s.done
	}
	if v.sessions != nil {
		v.sessions.close()
		<-v.sessions.done
	}
	for w := range ws {
		w.cancel()
	}
	return nil
}

// watcher queues stream events for one WatchStreams caller: the log never
// waits for it.
type watcher struct {
	mu   sync.Mutex
	q    []mqtt.StreamEvent
	sig  chan struct{} // cap 1
	out  chan mqtt.StreamEvent
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func newWatcher() *watcher {
	w := &watcher{sig: make(chan struct{}, 1), out: make(chan mqtt.StreamEvent), stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *watcher) push(evs ...mqtt.StreamEvent) {
	w.mu.Lock()
	w.q = append(w.q, evs...)
	w.mu.Unlock()
	select {
	case w.sig <- struct{}{}:
	default:
	}
}

func (w *watcher) run() {
	defer close(w.done)
	defer close(w.out)
	for {
		w.mu.Lock()
		var ev mqtt.StreamEvent
		have := len(w.q) > 0
		if have {
			ev = w.q[0]
			w.q = w.q[1:]
		}
		w.mu.Unlock()
		if !have {
			select {
			case <-w.sig:
				continue
			case <-w.stop:
				return
			}
		}
		select {
		case w.out <- ev:
		case <-w.stop:
			return
		}
	}
}

// cancel ends the watcher and returns once its channel is closed.
func (w *watcher) cancel() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}
