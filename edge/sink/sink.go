package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peatmq/peat/logstore"
)

// Defaults of Config.
const (
	DefaultBackoffMin = time.Second
	DefaultBackoffMax = 2 * time.Minute
	DefaultStallAfter = 60 * time.Second
	// DefaultReadBytes bounds one read from the log; a read never asks for
	// more records than the window has room for.
	DefaultReadBytes = 1 << 20
)

// GroupPrefix starts the consumer group that holds a sink's position in
// each of its streams: the sink "cloud" is the group "$sink.cloud", out of
// MQTT clients' reach as every group whose name starts with $.
const GroupPrefix = "$sink."

// Group is the consumer group of the sink named name.
func Group(name string) string { return GroupPrefix + name }

// Stream is one stream of the log as a sink reads it. *logstore.Stream and
// mqtt.Stream satisfy it; their contract (mqtt/log.go) is the one relied
// on: Read returns committed records and ErrOffsetOutOfRange below
// FirstOffset, Changed is closed when Committed may have moved.
type Stream interface {
	Name() string
	Read(from uint64, max, maxBytes int) ([]*logstore.Record, error)
	FirstOffset() uint64
	Committed() uint64
	Changed() <-chan struct{}
	OffsetForTime(t time.Time) (uint64, error)
}

// Positions keeps each sink's position per stream: the offset below which
// every record was acknowledged upstream (or skipped by the filter). Commit
// returns once the position is durable.
type Positions interface {
	Load(group, stream string) (off uint64, ok bool, err error)
	Commit(group, stream string, off uint64) error
}

// Upstream is where a sink sends records: one per sink, dialled again
// after every failure.
type Upstream interface {
	// Connect dials and returns once the upstream accepted the session.
	Connect(ctx context.Context) (Conn, error)
	// String names the upstream in logs and the API, without secrets.
	String() string
}

// Originer is an Upstream that names itself as a source of the same
// place would (source.Upstream.Origin): the sink skips the records whose
// origin (source.PropOrigin) it is, so what a source brought down from an
// upstream is never sent back up to it (no echo). Skipped records count
// as sent, as those the filter skips do.
type Originer interface {
	Origin() string
}

// Conn is one connection to an upstream.
type Conn interface {
	// Window is how many records may be unacknowledged at once.
	Window() int
	// Send queues one record for writing; Flush writes what is queued.
	// Either may block on a slow upstream and fails once the connection
	// has failed.
	Send(ctx context.Context, d Delivery) error
	Flush(ctx context.Context) error
	// Acks yields the ids of acknowledged deliveries; it is closed when
	// the connection ends, and Err then says why.
	Acks() <-chan uint64
	Err() error
	// Close ends the connection and waits for its goroutines.
	Close() error
}

// Delivery is one record on its way upstream.
type Delivery struct {
	ID     uint64 // unique within the sink's run
	Stream string
	Record *logstore.Record
}

// Config is one sink. Streams, Upstream and Positions are required.
type Config struct {
	Name      string
	Streams   []Stream
	Filter    string // an MQTT topic filter; "" sends every record
	Start     Start  // where a sink without a position begins
	Upstream  Upstream
	Positions Positions
	// Leadership, in a site, limits the sink to the streams this node
	// leads (lead.go); nil sends every stream here.
	Leadership Leadership

	BackoffMin, BackoffMax time.Duration
	// StallAfter: a stream with records to send and no acknowledged
	// progress for this long is stalled.
	StallAfter time.Duration
	// MaxRate caps records sent per second; 0 is no cap.
	MaxRate   float64
	ReadBytes int

	Logger  *slog.Logger
	Metrics *Metrics
}

// Sink sends its streams upstream, each from its position, keeping at
// most the connection's window of records in flight.
type Sink struct {
	cfg Config
	log *slog.Logger
	m   sinkMetrics
	// origin is the upstream's Origin ("" when it has none): records from
	// there are not sent back.
	origin string

	// streams is the list of cursors, one per stream sent; AddStream and
	// RemoveStream replace it (under streamsMu) while the pump runs, which
	// takes it afresh on each turn (pumpState.cursors).
	streamsMu   sync.Mutex
	streams     atomic.Pointer[[]*cursor]
	streamsWake chan struct{} // cap 1: the list changed
	monitorWake chan struct{} // cap 1: the list changed (for the gauges)

	// inflight maps delivery ids to records; nextID numbers deliveries.
	// Owned by the pump (Run's goroutine).
	inflight map[uint64]ref
	nextID   uint64

	paused    atomic.Bool
	pauseWake chan struct{} // cap 1: the pump looks at paused again

	connected  atomic.Bool
	window     atomic.Int64
	reconnects atomic.Uint64
	started    time.Time

	mu struct {
		sync.Mutex
		lastErr   string
		lastErrAt time.Time
	}
}

// New loads the sink's position in each stream, resolving Start (and
// committing it) for a stream it has none in.
func New(cfg Config) (*Sink, error) {
	if cfg.Upstream == nil || cfg.Positions == nil || len(cfg.Streams) == 0 {
		return nil, fmt.Errorf("sink %s: %w", cfg.Name, ErrIncomplete)
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = DefaultBackoffMin
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(DefaultBackoffMax, cfg.BackoffMin)
	}
	if cfg.StallAfter <= 0 {
		cfg.StallAfter = DefaultStallAfter
	}
	if cfg.ReadBytes <= 0 {
		cfg.ReadBytes = DefaultReadBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Sink{
		cfg:       cfg,
		log:       cfg.Logger.With(attrSink, cfg.Name),
		pauseWake: make(chan struct{}, 1),
		started:   time.Now(),

		streamsWake: make(chan struct{}, 1),
		monitorWake: make(chan struct{}, 1),
	}
	s.m = cfg.Metrics.forSink(cfg.Name)
	if o, ok := cfg.Upstream.(Originer); ok {
		s.origin = o.Origin()
	}
	var cursors []*cursor
	for _, st := range cfg.Streams {
		c, err := s.newCursor(st, false)
		if err != nil {
			return nil, err
		}
		cursors = append(cursors, c)
	}
	s.streams.Store(&cursors)
	return s, nil
}

// newCursor makes the sink's cursor in st. On a single node it loads the
// position now (open); in a site only the stream's leader does, when it
// takes the stream up (lead.go). A stream added to a running sink
// (added) is taken up by the pump too, as a new leader's is: take asks
// a Resumer where the upstream's copy ends before the first send, as a
// connection does for the streams it starts with, so records a crashed
// run left there are not sent again.
func (s *Sink) newCursor(st Stream, added bool) (*cursor, error) {
	c := &cursor{stream: st, name: st.Name(), m: s.m.forStream(st.Name())}
	c.progressAt.Store(time.Now().UnixNano())
	if s.cfg.Leadership != nil {
		return c, nil
	}
	if err := s.open(c); err != nil {
		return nil, err
	}
	c.next, c.led = c.position.Load(), !added
	s.watchBase(c)
	return c, nil
}

// open loads the sink's position in c's stream, resolving Start (and
// committing it) when it has none.
func (s *Sink) open(c *cursor) error {
	group := Group(s.cfg.Name)
	off, ok, err := s.cfg.Positions.Load(group, c.name)
	if err != nil {
		return fmt.Errorf("sink %s: load position in %s: %w", s.cfg.Name, c.name, err)
	}
	if !ok {
		if off, err = s.cfg.Start.resolve(c.stream); err != nil {
			return fmt.Errorf("sink %s: start in %s: %w", s.cfg.Name, c.name, err)
		}
		if err := s.cfg.Positions.Commit(group, c.name, off); err != nil {
			return fmt.Errorf("sink %s: commit start in %s: %w", s.cfg.Name, c.name, err)
		}
		s.log.Info("sink starts", attrStream, c.name, attrOffset, off, attrStart, s.cfg.Start.String())
	}
	c.position.Store(off)
	c.m.committed.Set(float64(off))
	return nil
}

// watchBase notes the position a Watcher shows now: only a later change
// of it is a seek (pump). In a site the node taking a stream up may still
// show an older value until its broker reloads the stream's state.
func (s *Sink) watchBase(c *cursor) {
	if w, ok := s.cfg.Positions.(Watcher); ok {
		c.watched, c.watchedOK, _ = w.Watch(Group(s.cfg.Name), c.name)
	}
}

// cursors is the current list of cursors; callers must not change it.
func (s *Sink) cursors() []*cursor { return *s.streams.Load() }

// Has reports whether the sink sends the stream named name.
func (s *Sink) Has(name string) bool {
	for _, c := range s.cursors() {
		if c.name == name {
			return true
		}
	}
	return false
}

// AddStream makes the sink send st too, from its position there (or
// Start), as for the streams it was made with: a sink of every stream
// follows the streams added while it runs. A stream it already sends is
// left as it is.
func (s *Sink) AddStream(st Stream) error {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	if s.Has(st.Name()) {
		return nil
	}
	c, err := s.newCursor(st, true)
	if err != nil {
		return err
	}
	s.setStreams(append(slices.Clone(s.cursors()), c))
	s.log.Info("sink follows a new stream", attrStream, st.Name(), attrOffset, c.position.Load())
	return nil
}

// RemoveStream stops sending the stream named name (removed from the
// log). Its position stays where it is; what was in flight is forgotten.
func (s *Sink) RemoveStream(name string) {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	cs := slices.DeleteFunc(slices.Clone(s.cursors()), func(c *cursor) bool { return c.name == name })
	if len(cs) != len(s.cursors()) {
		s.setStreams(cs)
		s.log.Info("sink stops sending a removed stream", attrStream, name)
	}
}

// setStreams publishes a new list; the caller holds streamsMu.
func (s *Sink) setStreams(cs []*cursor) {
	s.streams.Store(&cs)
	for _, ch := range []chan struct{}{s.streamsWake, s.monitorWake} {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Name is the sink's name.
func (s *Sink) Name() string { return s.cfg.Name }

// Pause stops sending new records (acknowledgements of those in flight
// still count); Resume starts again. Neither outlives a restart.
func (s *Sink) Pause()  { s.setPaused(true) }
func (s *Sink) Resume() { s.setPaused(false) }

func (s *Sink) setPaused(p bool) {
	if s.paused.Swap(p) != p {
		s.log.Info("sink paused", attrPaused, p)
		select {
		case s.pauseWake <- struct{}{}:
		default:
		}
	}
}

// Run connects, sends and reconnects until ctx is done. In a site it
// connects only while this node leads one of the sink's streams.
func (s *Sink) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the health monitor, owned by Run
		defer wg.Done()
		s.monitor(ctx)
	}()
	defer wg.Wait()

	backoff := s.cfg.BackoffMin
	first := true
	for ctx.Err() == nil {
		if !s.waitLead(ctx) {
			return
		}
		conn, err := s.cfg.Upstream.Connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.failed("connect", err)
		} else {
			if !first {
				s.reconnects.Add(1)
				s.m.reconnects.Inc()
			}
			first = false
			s.window.Store(int64(conn.Window()))
			s.connected.Store(true)
			s.log.Info("sink connected", attrUpstream, s.cfg.Upstream.String(), attrWindow, conn.Window())
			progressed, err := s.pump(ctx, conn)
			s.connected.Store(false)
			s.window.Store(0)
			_ = conn.Close()
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, errStandby) {
				s.log.Info("sink disconnects: it has no stream to send here (removed, or led by another node)", attrUpstream, s.cfg.Upstream.String())
				backoff = s.cfg.BackoffMin
				continue
			}
			s.failed("connection", err)
			if progressed {
				backoff = s.cfg.BackoffMin
			}
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, s.cfg.BackoffMax)
	}
}

// failed records why the upstream failed.
func (s *Sink) failed(stage string, err error) {
	reason := Reason(err)
	s.m.errors(reason).Inc()
	s.mu.Lock()
	s.mu.lastErr, s.mu.lastErrAt = fmt.Sprintf("%s: %v", stage, err), time.Now()
	s.mu.Unlock()
	s.log.Warn("sink upstream failed", attrUpstream, s.cfg.Upstream.String(), attrStage, stage, attrReason, reason, attrErr, err)
}

// ErrIncomplete is a Config without streams, upstream or positions.
var ErrIncomplete = errors.New("sink: config needs streams, an upstream and positions")

// Reasoner is an error that names its reason for peat_sink_errors_total.
type Reasoner interface{ Reason() string }

// Reason is err's label in peat_sink_errors_total.
func Reason(err error) string {
	var r Reasoner
	switch {
	case errors.As(err, &r):
		return r.Reason()
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case err == nil:
		return "closed"
	}
	return "network"
}
