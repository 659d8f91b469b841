package cluster

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
)

// Fetch limits a leader applies to a request.
const (
	defaultFetchBytes = 1 << 20
	maxFetchBytes     = wire.MaxFrame / 2
	maxFetchWait      = 30 * time.Second
)

// Leader serves a stream it leads to the followers' fetches and keeps its
// high watermark at the lowest log end in the ISR. The stream's store must
// run with logstore.Config.ManualCommit. One goroutine, started by
// NewLeader and stopped by Close, moves the watermark when the leader's
// own log end moves (a lone leader's ISR is itself).
type Leader struct {
	self   string
	stream *logstore.Stream
	epoch  uint32
	log    *slog.Logger

	mu struct {
		sync.Mutex
		tr *rules.Tracker // the watermark, min_insync_replicas and the ISR changes to propose
		// current, when set, says whether this leader may still commit
		// (see SetCurrent); false holds the watermark.
		current func() bool
		// joinable, when set, says whether a replica holds what else the
		// leader replicates (the Log's consumer state): only then is it a
		// Joiner.
		joinable func(id string) bool
		// drainWake, while Drain waits, is closed (and cleared) by the
		// next fetch or ISR change: a follower's log end may have moved.
		drainWake chan struct{}
	}
	// appends counts the producers' appends Log has handed to the stream
	// under this Leader: Close waits for them to be written, so no record
	// of this epoch lands after a Fetcher has truncated the log.
	appends struct {
		sync.Mutex
		closing  bool
		draining bool // Drain began: appends are refused as once closing
		n        sync.WaitGroup
	}
	stop chan struct{}
	done chan struct{}
}

// beginAppend admits a producer's append; false once Close or Drain has
// begun.
func (l *Leader) beginAppend() bool {
	l.appends.Lock()
	defer l.appends.Unlock()
	if l.appends.closing || l.appends.draining {
		return false
	}
	l.appends.n.Add(1)
	return true
}

// endAppend: an append beginAppend admitted was written or refused.
func (l *Leader) endAppend() { l.appends.n.Done() }

// Stream is the stream the leader leads.
func (l *Leader) Stream() *logstore.Stream { return l.stream }

// NewLeader makes self the leader of stream in leader epoch epoch (the
// controller's), with the ISR isr; records appended from now on carry the
// epoch.
func NewLeader(self string, stream *logstore.Stream, epoch uint32, isr []string, log *slog.Logger) *Leader {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Leader{self: self, stream: stream, epoch: epoch, stop: make(chan struct{}), done: make(chan struct{}),
		log: log.With(slog.String("stream", stream.Name()), slog.Uint64("leader_epoch", uint64(epoch)))}
	l.mu.tr = rules.NewTracker(self, isr, time.Now())
	stream.SetEpoch(epoch)
	go l.run()
	return l
}

// Close refuses further appends, waits for those admitted to be written
// and stops the leader's goroutine; it is idempotent.
func (l *Leader) Close() {
	l.appends.Lock()
	l.appends.closing = true
	l.appends.Unlock()
	l.appends.n.Wait()
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// Drain is a graceful stop's wait on an acks: leader stream, whose
// leader acknowledges records before any follower holds them. From now
// on it refuses appends, and the Log's consumer-state writes, with
// ErrLeaderUnavailable, as while leadership moves (producers resend to
// the next leader, mqtt writes the state again); it waits for the
// appends admitted to be written, then until every ISR member, and every
// joiner the watermark counts, has fetched up to the leader's log end.
// Any of them the controller then elects holds every record
// acknowledged. It reports whether they did before ctx ended or the
// leader closed. Appends stay refused until Resume (a leader balancing
// whose election was not made; a hand-over never resumes).
func (l *Leader) Drain(ctx context.Context) bool {
	l.appends.Lock()
	l.appends.draining = true
	l.appends.Unlock()
	l.appends.n.Wait() // each is written or refused within a group commit
	for {
		l.mu.Lock()
		end := l.stream.NextOffset()
		caughtUp := l.mu.tr.HW(end) >= end // every member's end, not the watermark min_insync_replicas may hold
		if !caughtUp && l.mu.drainWake == nil {
			l.mu.drainWake = make(chan struct{})
		}
		wake := l.mu.drainWake
		l.mu.Unlock()
		if caughtUp {
			return true
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return false
		case <-l.stop:
			return false
		}
	}
}

// Resume takes appends and state writes again after a Drain, when the
// leadership it was to end stays (the election was not made).
func (l *Leader) Resume() {
	l.appends.Lock()
	defer l.appends.Unlock()
	l.appends.draining = false
}

// holdingAll are the ISR followers that have fetched up to the leader's
// log end, with the broker epochs they fetched in: after a Drain that ran
// out of time, the members the ISR may shrink to so that the controller's
// election cannot pick one that lacks acknowledged records.
func (l *Leader) holdingAll() []rules.ISRMember {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.tr.HoldingAll(l.stream.NextOffset())
}

// draining reports whether Drain has begun: consumer-state writes are
// refused from then on, as appends are.
func (l *Leader) draining() bool {
	l.appends.Lock()
	defer l.appends.Unlock()
	return l.appends.draining
}

// wakeDrainLocked tells a waiting Drain that a log end or the ISR moved;
// l.mu is held.
func (l *Leader) wakeDrainLocked() {
	if l.mu.drainWake != nil {
		close(l.mu.drainWake)
		l.mu.drainWake = nil
	}
}

func (l *Leader) run() {
	defer close(l.done)
	for {
		ch := l.stream.Appended()
		l.advance()
		select {
		case <-l.stop:
			return
		case <-ch:
		}
	}
}

// SetMinInsync sets min_insync_replicas: while the ISR is smaller the
// leader commits nothing, so acks=all answers nothing, even a leader
// alone in its ISR (a deposed one cannot commit on its own). 0 or 1: no
// minimum.
func (l *Leader) SetMinInsync(n int) {
	l.mu.Lock()
	l.mu.tr.SetMinInsync(n)
	l.mu.Unlock()
	l.advance()
}

// SetCurrent installs the check, made before every move of the
// watermark, that this leader is still the controller's leader: a leader
// the controller deposed, or that cannot know (cut off from it for longer
// than a lease), commits nothing more, whatever its ISR.
func (l *Leader) SetCurrent(current func() bool) {
	l.mu.Lock()
	l.mu.current = current
	l.mu.Unlock()
	l.advance()
}

// Current reports whether this leader may still commit (SetCurrent's
// check): false once it is deposed, or cut off from the controller.
func (l *Leader) Current() bool {
	l.mu.Lock()
	current := l.mu.current
	l.mu.Unlock()
	return current == nil || current() // outside mu: it takes the Node's locks
}

// InSync reports whether the ISR has at least min_insync_replicas
// members: when it does not, a producer's append is to be refused.
func (l *Leader) InSync() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.tr.InSync()
}

// SetISR applies an ISR change the controller committed.
func (l *Leader) SetISR(isr []string) {
	l.mu.Lock()
	l.mu.tr.SetISR(isr)
	l.wakeDrainLocked()
	l.mu.Unlock()
	l.advance()
}

// Laggards and Joiners are the ISR changes the leader should propose (see
// rules.Tracker).
func (l *Leader) Laggards(now time.Time, lagMax, silentMax time.Duration) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.tr.Laggards(now, lagMax, silentMax)
}

// Joiners are the replicas outside the ISR that caught up to the
// watermark (and, with setJoinable, to the rest of what the leader
// replicates).
//
// From here on the watermark waits for each joiner too, until the ISR
// takes it or KeepJoining drops it (rules.Tracker.Joiners): the caller
// proposes them, then says which it named.
func (l *Leader) Joiners() []rules.ISRMember {
	l.mu.Lock()
	// Committed under mu is the watermark advance last published: it
	// publishes under mu too, so none passes a joiner's end unseen.
	js := l.mu.tr.Joiners(l.stream.Committed())
	joinable := l.mu.joinable
	l.mu.Unlock()
	if joinable == nil {
		return js
	}
	out := js[:0]
	for _, j := range js {
		if joinable(j.ID) { // outside mu: it takes the Log's locks
			out = append(out, j)
		}
	}
	return out
}

// KeepJoining says which joiners a proposal named (nil: none, or the
// proposal failed): the watermark stops waiting for the others.
func (l *Leader) KeepJoining(ids []string) {
	l.mu.Lock()
	l.mu.tr.KeepJoining(ids)
	l.wakeDrainLocked()
	l.mu.Unlock()
	l.advance()
}

// setJoinable installs the Log's check that a replica holds the stream's
// consumer state too, so that a replica the ISR takes back, and which may
// then be elected, does not lack state writes already answered.
func (l *Leader) setJoinable(f func(id string) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.joinable = f
}

// advance moves the high watermark to the lowest log end in the ISR (and
// among the joiners). It computes and publishes under mu, so Joiners sees
// every watermark published before it (logstore publishes without I/O).
func (l *Leader) advance() {
	l.mu.Lock()
	current := l.mu.current
	l.mu.Unlock()
	if current != nil && !current() { // outside mu: it takes the Node's locks
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	hw, ok := l.mu.tr.Advance(l.stream.NextOffset(), l.stream.Committed())
	if !ok {
		return
	}
	if err := l.stream.SetHighWatermark(context.Background(), hw); err != nil && !errors.Is(err, logstore.ErrClosed) {
		l.log.Warn("cluster: set high watermark", slog.Uint64("hw", hw), slog.Any("err", err))
	}
}

func (l *Leader) checkEpoch(e uint32) wire.Code {
	switch {
	case e < l.epoch:
		return wire.FencedLeaderEpoch
	case e > l.epoch:
		return wire.UnknownLeaderEpoch
	}
	return wire.None
}

// fetch answers a follower: the records from its offset on, after waiting
// up to its MaxWaitMs for some when it has them all (the long poll).
func (l *Leader) fetch(ctx context.Context, req *wire.FetchRequest) wire.FetchResponse {
	resp := wire.FetchResponse{LeaderEpoch: l.epoch}
	fill := func(code wire.Code) wire.FetchResponse {
		resp.Code = code
		resp.HighWatermark = l.stream.Committed()
		resp.LogStart, resp.LogEnd = l.stream.FirstOffset(), l.stream.NextOffset()
		return resp
	}
	if c := l.checkEpoch(req.LeaderEpoch); c != wire.None {
		return fill(c)
	}
	// A follower may hold records the leader is still writing (ShipEnd,
	// logstore's early shipping): its offset counts up to there, while
	// the leader's own durable end (NextOffset) bounds the watermark.
	end := l.stream.NextOffset()
	if req.Offset < l.stream.FirstOffset() || req.Offset > l.stream.ShipEnd() {
		return fill(wire.OffsetOutOfRange)
	}
	l.mu.Lock()
	l.mu.tr.Fetched(req.ReplicaID, req.BrokerEpoch, req.Offset, end, time.Now())
	l.wakeDrainLocked()
	l.mu.Unlock()
	l.advance()
	if req.Offset >= l.stream.ShipEnd() && req.MaxWaitMs > 0 {
		wait := min(time.Duration(req.MaxWaitMs)*time.Millisecond, maxFetchWait)
		if !l.wait(ctx, req.Offset, req.HighWatermark, wait) {
			return fill(wire.NotLeader) // the stream closed or went away
		}
		l.mu.Lock()
		l.mu.tr.Heard(req.ReplicaID, req.BrokerEpoch, time.Now())
		l.mu.Unlock()
	}
	maxBytes := int(req.MaxBytes)
	if maxBytes == 0 {
		maxBytes = defaultFetchBytes
	}
	recs, err := l.stream.ReadRaw(req.Offset, 0, min(maxBytes, maxFetchBytes))
	var corrupt *logstore.CorruptError
	switch {
	case errors.As(err, &corrupt):
		l.log.Error("cluster: corrupt record served to a follower", slog.Uint64("offset", corrupt.Offset), slog.Any("err", err))
		return fill(wire.CorruptRecord)
	case errors.Is(err, logstore.ErrOffsetOutOfRange):
		return fill(wire.OffsetOutOfRange)
	case err != nil:
		return fill(wire.Unknown)
	}
	resp.Base, resp.Records = req.Offset, recs
	return fill(wire.None)
}

// wait waits up to d until the log goes past offset or the watermark past
// hw (what the follower last heard); false if the stream closed.
func (l *Leader) wait(ctx context.Context, offset, hw uint64, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		appended, changed := l.stream.Appended(), l.stream.Changed()
		if l.stream.ShipEnd() > offset || l.stream.Committed() > hw {
			return true
		}
		select {
		case <-ctx.Done():
			return true
		case <-timer.C:
			return true
		case <-l.stop:
			return true
		case <-appended:
		case <-changed:
		}
		if streamClosed(l.stream) { // closed channels stay closed
			return false
		}
	}
}

// streamClosed reports whether s is closed or removed, without waiting.
func streamClosed(s *logstore.Stream) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.WaitAppended(ctx, math.MaxUint64) // never past: closed, or ctx's error
	return !errors.Is(err, context.Canceled)
}

// endForEpoch answers KIP-101/279's question: where does the largest epoch
// at or below the one asked end in the leader's log? An epoch above the
// leader's latest is answered with its latest, which ends at its log end.
func (l *Leader) endForEpoch(req *wire.EpochRequest) wire.EpochResponse {
	if c := l.checkEpoch(req.LeaderEpoch); c != wire.None {
		return wire.EpochResponse{Code: c}
	}
	if e, end, ok := l.stream.EndOffsetForEpoch(req.Epoch); ok {
		return wire.EpochResponse{Epoch: e, EndOffset: end}
	}
	latest, _, _ := l.stream.LatestEpoch()
	return wire.EpochResponse{Epoch: latest, EndOffset: l.stream.NextOffset()}
}
