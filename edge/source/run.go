package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peatmq/peat/logstore"
)

// Stream is the stream a source appends to, as the framework uses it.
// mqtt.Stream and *logstore.Stream satisfy it, with their contract
// (mqtt/log.go): AppendAsync calls done once the records are committed,
// in the order of the calls; Read returns committed records.
type Stream interface {
	Name() string
	AppendAsync(recs []*logstore.Record, done func(first uint64, err error))
	Read(from uint64, max, maxBytes int) ([]*logstore.Record, error)
	FirstOffset() uint64
	Committed() uint64
}

// LogEnder is a Stream that also knows where its log ends, committed or
// not (in a site, a new leader holds records its predecessor appended
// that its watermark does not cover yet). A source waits until the
// watermark reaches that end before it connects, so that Resume sees
// every record an earlier leader stored: a QoS 2 redelivery of one of
// them is then recognised, not stored twice.
type LogEnder interface {
	LogEnd() uint64
	Changed() <-chan struct{}
}

// Log is the node's log as a source finds its stream in it.
type Log interface {
	// Stream returns the named stream, or nil when the log has none.
	Stream(name string) Stream
	// Route names the stream that captures topic ("" for none).
	Route(topic string) string
}

// Positions keeps a durable offset per (group, stream): the broker's
// consumer groups, which a site replicates with the stream (the same
// interface, and value, as sink.Positions). Commit returns once the
// offset is durable.
type Positions interface {
	Load(group, stream string) (off uint64, ok bool, err error)
	Commit(group, stream string, off uint64) error
}

// Config is one source. Log, Stream, Upstream and Marks are required.
type Config struct {
	Name     string
	Kind     string // mqtt, kafka, peat: for the API
	Stream   string // the stream it appends to
	Log      Log
	Upstream Upstream
	Marks    Positions // where Resume.Mark lives
	// Leadership, in a site, runs the source only on the node that leads
	// Stream; nil runs it here.
	Leadership Leadership

	BackoffMin, BackoffMax time.Duration
	// StallAfter: messages waiting to be durable (or a lag the upstream
	// reports) and nothing made durable for this long is stalled.
	StallAfter time.Duration
	// Ahead bounds the batches from Next waiting to be durable at once.
	Ahead int

	Logger  *slog.Logger
	Metrics *Metrics
}

// ErrIncomplete is a Config without log, stream, upstream or marks.
var ErrIncomplete = errors.New("source: config needs a log, a stream, an upstream and marks")

// Source runs one upstream into one stream.
type Source struct {
	cfg Config
	log *slog.Logger
	m   sourceMetrics

	paused    atomic.Bool
	wake      chan struct{} // cap 1: paused changed
	connected atomic.Bool
	standby   atomic.Bool // in a site, another node leads the stream

	lag        atomic.Pointer[Lagger] // of the current connection
	pending    atomic.Int64           // messages waiting to be durable
	headSince  atomic.Int64           // unix ns the oldest batch waiting was received; 0: none
	progressAt atomic.Int64           // unix ns of the last batch made durable, or of the connection

	received, appended, duplicates, dropped atomic.Uint64
	lastReceived, lastDurable               atomic.Int64 // unix ns
	reconnects                              atomic.Uint64

	mu struct {
		sync.Mutex
		lastErr   string
		lastErrAt time.Time
	}
}

// New checks cfg and fills its defaults; it dials nothing.
func New(cfg Config) (*Source, error) {
	if cfg.Log == nil || cfg.Stream == "" || cfg.Upstream == nil || cfg.Marks == nil {
		return nil, fmt.Errorf("source %s: %w", cfg.Name, ErrIncomplete)
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
	if cfg.Ahead <= 0 {
		cfg.Ahead = DefaultAhead
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Source{cfg: cfg, log: cfg.Logger.With(attrSource, cfg.Name), wake: make(chan struct{}, 1)}
	s.m = cfg.Metrics.forSource(cfg.Name)
	s.progressAt.Store(time.Now().UnixNano())
	return s, nil
}

// Name is the source's name.
func (s *Source) Name() string { return s.cfg.Name }

// Pause closes the connection and keeps it closed until Resume: an
// upstream with a persistent session keeps what arrives meanwhile.
// Neither outlives a restart.
func (s *Source) Pause()  { s.setPaused(true) }
func (s *Source) Resume() { s.setPaused(false) }

func (s *Source) setPaused(p bool) {
	if s.paused.Swap(p) != p {
		s.log.Info("source paused", attrPaused, p)
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

var (
	errPaused  = errors.New("paused")
	errStandby = errors.New("another node leads the stream")
)

// Run connects, appends and reconnects until ctx is done. In a site it
// connects only while this node leads the source's stream.
func (s *Source) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.monitor(ctx) })
	defer wg.Wait()

	backoff := s.cfg.BackoffMin
	first := true
	var told <-chan struct{} // the last connection's appends are all told
	for ctx.Err() == nil {
		if told != nil {
			select {
			case <-told:
			case <-ctx.Done():
				return
			}
		}
		st, epoch, ok := s.waitRun(ctx)
		if !ok {
			return
		}
		if !s.settle(ctx, st) {
			continue // paused, moved, or ctx ended: look again
		}
		conn, err := s.cfg.Upstream.Connect(ctx, &resume{s: s, st: st})
		switch {
		case ctx.Err() != nil:
			if conn != nil {
				_ = conn.Close()
			}
			return
		case err != nil:
			s.failed("connect", err)
		default:
			if !first {
				s.reconnects.Add(1)
				s.m.reconnects.Inc()
			}
			first = false
			s.log.Info("source connected", attrUpstream, s.cfg.Upstream.String(), attrStream, st.Name())
			var progressed bool
			progressed, told, err = s.serve(ctx, conn, st, epoch)
			_ = conn.Close()
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, errPaused) || errors.Is(err, errStandby) {
				s.log.Info("source disconnects", attrUpstream, s.cfg.Upstream.String(), attrReason, err.Error())
				backoff = s.cfg.BackoffMin
				continue
			}
			s.failed("connection", err)
			if progressed {
				backoff = s.cfg.BackoffMin
			}
		}
		if !sleep(ctx, backoff, s.wake) {
			return
		}
		backoff = min(2*backoff, s.cfg.BackoffMax)
	}
}

// sleep waits d, or less when the source is paused meanwhile (the wait
// ends and Run waits for Resume instead); false when ctx ended.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-wake:
	}
	return true
}

// waitRun returns the source's stream once the source may run: not
// paused, the stream exists and (in a site) this node leads it, in the
// leader epoch returned.
func (s *Source) waitRun(ctx context.Context) (Stream, uint64, bool) {
	poll := time.NewTicker(time.Second) // a stream created later
	defer poll.Stop()
	for {
		var changed <-chan struct{}
		if ld := s.cfg.Leadership; ld != nil {
			changed = ld.Changed()
		}
		st, epoch, ok := s.runnable()
		if ok {
			return st, epoch, true
		}
		select {
		case <-ctx.Done():
			return nil, 0, false
		case <-changed:
		case <-s.wake:
		case <-poll.C:
		}
	}
}

// settle waits until st's watermark covers its log end as it is now (a
// LogEnder; others are settled), and reports false when the source may
// no longer run here or ctx ended meanwhile.
func (s *Source) settle(ctx context.Context, st Stream) bool {
	le, ok := st.(LogEnder)
	if !ok {
		return true
	}
	end := le.LogEnd()
	poll := time.NewTicker(100 * time.Millisecond) // leadership and pause, meanwhile
	defer poll.Stop()
	for {
		changed := le.Changed()
		if st.Committed() >= end {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		case <-poll.C:
			if _, _, ok := s.runnable(); !ok {
				return false
			}
		}
	}
}

// runnable reports whether the source may run now, and where.
func (s *Source) runnable() (Stream, uint64, bool) {
	var epoch uint64
	if ld := s.cfg.Leadership; ld != nil {
		var here bool
		_, epoch, here = ld.Leader(s.cfg.Stream)
		s.standby.Store(!here)
		if !here {
			return nil, 0, false
		}
	}
	if s.paused.Load() {
		return nil, 0, false
	}
	st := s.cfg.Log.Stream(s.cfg.Stream)
	return st, epoch, st != nil
}

// failed records why the upstream failed.
func (s *Source) failed(stage string, err error) {
	reason := Reason(err)
	s.m.errors(reason).Inc()
	s.mu.Lock()
	s.mu.lastErr, s.mu.lastErrAt = fmt.Sprintf("%s: %v", stage, err), time.Now()
	s.mu.Unlock()
	s.log.Warn("source upstream failed", attrUpstream, s.cfg.Upstream.String(), attrStage, stage, attrReason, reason, attrErr, err)
}
