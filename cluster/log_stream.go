package cluster

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// stream is one visible stream of a Log: this node's replica, appended to
// only while this node's Replicator leads it.
//
// Its goroutine answers appends in call order (each once the high
// watermark passed it, or refused), forwards the replica's Changed, and
// notices this node becoming the leader (StateMoved, claims reset).
type stream struct {
	l    *Log
	st   *logstore.Stream
	name string

	kick chan struct{} // cap 1: an append was written or queued
	stop chan struct{} // closed by close
	done chan struct{} // the goroutine ended; every append answered

	mu struct {
		sync.Mutex
		pending []*pendingAppend // call order
		closed  bool
		changed chan struct{}
		moved   chan struct{}
		leader  *Leader           // the Leader last seen; claims belong to it
		claims  map[string]string // key -> holder, while leader
	}
	stopOnce sync.Once
}

// pendingAppend is one AppendAsync call until its done is called.
type pendingAppend struct {
	done   func(uint64, error)
	leader *Leader      // nil: refused at once with err
	err    error        // the refusal when leader is nil
	res    atomic.Value // appendResult, once the replica wrote it or refused
}

type appendResult struct {
	first, end uint64
	err        error
}

var _ mqtt.Stream = (*stream)(nil)

func newStream(l *Log, st *logstore.Stream) *stream {
	s := &stream{l: l, st: st, name: st.Name(), kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	s.mu.changed = make(chan struct{})
	s.mu.moved = make(chan struct{})
	s.mu.leader = s.leading()
	s.mu.claims = map[string]string{}
	go s.run(st.Changed()) // taken before Changed can be called: no advance is missed
	return s
}

// leading is the Leader this node runs for the stream's replica, nil when
// it does not lead it.
func (s *stream) leading() *Leader {
	ld, _ := s.l.rep.Leading(s.name)
	if ld == nil || ld.Stream() != s.st {
		return nil
	}
	return ld
}

func (s *stream) Name() string      { return s.name }
func (s *stream) Filters() []string { return s.st.Filters() }

// AppendAsync appends on the stream's leader and calls done once the
// in-sync replicas hold the records (the high watermark passed them). It
// refuses, in call order, with mqtt.ErrLeaderUnavailable on a node that
// does not lead the stream (forwarding to the leader is not done yet) or
// that stops leading it before the records commit, and with
// mqtt.ErrNotEnoughReplicas while the ISR is below min_insync_replicas.
// A refused append may still have been written, and be committed later
// by a new leader: the producer's retry then duplicates it (at least
// once, as Kafka's producers without idempotence).
func (s *stream) AppendAsync(recs []*logstore.Record, done func(first uint64, err error)) {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		done(0, fmt.Errorf("cluster: append to %s: %w", s.name, logstore.ErrClosed))
		return
	}
	p := &pendingAppend{done: done}
	ld := s.leading()
	switch {
	case ld == nil:
		p.err = fmt.Errorf("cluster: append to %s: this node does not lead it: %w", s.name, mqtt.ErrLeaderUnavailable)
	case !ld.InSync():
		p.err = fmt.Errorf("cluster: append to %s: %w", s.name, mqtt.ErrNotEnoughReplicas)
	case !ld.beginAppend():
		p.err = fmt.Errorf("cluster: append to %s: leadership ending: %w", s.name, mqtt.ErrLeaderUnavailable)
	default:
		p.leader = ld
	}
	s.mu.pending = append(s.mu.pending, p)
	if p.leader != nil {
		// Under mu, so that the replica takes appends in call order. Its
		// done may run at once (a closed store): it takes no lock of ours.
		n := uint64(len(recs))
		s.st.AppendAsync(recs, func(first uint64, err error) {
			ld.endAppend()
			p.res.Store(appendResult{first: first, end: first + n, err: err})
			s.wake()
		})
	}
	s.mu.Unlock()
	s.wake()
}

func (s *stream) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run answers appends and forwards Changed until close; then it answers
// what is still pending.
func (s *stream) run(u <-chan struct{}) {
	defer close(s.done)
	for {
		_, repChanged := s.l.rep.Leading(s.name) // before looking: a change from now on closes it
		s.answer(s.noteLeader(), false)
		select {
		case <-s.stop:
			s.drain()
			return
		case <-u:
			u = s.st.Changed() // before telling: an advance from now on closes it
			s.mu.Lock()
			close(s.mu.changed)
			s.mu.changed = make(chan struct{})
			s.mu.Unlock()
			if streamClosed(s.st) { // the store closed it; the Log removes it
				<-s.stop
				s.drain()
				return
			}
		case <-repChanged:
		case <-s.kick:
		}
	}
}

// noteLeader fires StateMoved when this node has become the stream's
// leader (mqtt reloads the state this leader now serves), and drops the
// claims of an earlier leadership.
//
// Whoever looks first (run, Claim, StateMoved) notes the change, under mu
// and from the Replicator's current answer, so a stale look never undoes
// a newer one.
func (s *stream) noteLeader() *Leader {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.noteLeaderLocked()
}

func (s *stream) noteLeaderLocked() *Leader {
	ld := s.leading()
	if ld == s.mu.leader {
		return ld
	}
	if ld != nil {
		close(s.mu.moved)
		s.mu.moved = make(chan struct{})
	}
	s.mu.leader = ld
	clear(s.mu.claims)
	return ld
}

// answer calls done for the appends at the head of the queue that are
// settled: committed, refused, or, under a leader no longer current (or
// below min_insync_replicas), given up. closing gives up the rest of the
// written ones with ErrClosed.
func (s *stream) answer(ld *Leader, closing bool) (empty bool) {
	var calls []answerCall
	s.mu.Lock()
	for len(s.mu.pending) > 0 {
		p := s.mu.pending[0]
		c := answerCall{done: p.done, err: p.err}
		if p.leader != nil {
			r, ok := p.res.Load().(appendResult)
			if !ok {
				break // not written yet
			}
			switch committed := s.st.Committed(); {
			case r.err != nil:
				c.err = r.err
			case r.end <= committed:
				c.first = r.first
			case closing:
				c.err = fmt.Errorf("cluster: append to %s: %w", s.name, logstore.ErrClosed)
			case p.leader != ld:
				c.err = fmt.Errorf("cluster: append to %s: leadership moved before the records committed: %w", s.name, mqtt.ErrLeaderUnavailable)
			case !ld.InSync():
				c.err = fmt.Errorf("cluster: append to %s: the ISR fell below min_insync_replicas: %w", s.name, mqtt.ErrNotEnoughReplicas)
			default:
				s.mu.Unlock()
				s.call(calls)
				return false
			}
		}
		calls = append(calls, c)
		s.mu.pending = s.mu.pending[1:]
	}
	empty = len(s.mu.pending) == 0
	s.mu.Unlock()
	s.call(calls)
	return empty
}

// answerCall is one done call, made outside mu (done may append again).
type answerCall struct {
	done  func(uint64, error)
	first uint64
	err   error
}

func (s *stream) call(calls []answerCall) {
	for _, c := range calls {
		c.done(c.first, c.err)
	}
}

// drain answers every pending append after close: each is written or
// refused by the replica soon (its appender runs until the store closes).
func (s *stream) drain() {
	s.mu.Lock()
	close(s.mu.changed) // stays closed: Changed of a closed stream never blocks
	s.mu.Unlock()
	for !s.answer(nil, true) {
		<-s.kick
	}
}

// close makes the stream behave as closed (appends, reads and state fail
// with ErrClosed, Changed is closed) and stops its goroutine once every
// pending append is answered; idempotent. Wait on done.
func (s *stream) close() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.mu.closed = true
		s.mu.Unlock()
		close(s.stop)
	})
}

func (s *stream) closedErr(what string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return fmt.Errorf("cluster: %s %s: %w", what, s.name, logstore.ErrClosed)
	}
	return nil
}

// Read serves committed records, on every replica.
func (s *stream) Read(from uint64, max, maxBytes int) ([]*logstore.Record, error) {
	if err := s.closedErr("read"); err != nil {
		return nil, err
	}
	return s.st.Read(from, max, maxBytes)
}

func (s *stream) OffsetForTime(t time.Time) (uint64, error) {
	if err := s.closedErr("offset for time in"); err != nil {
		return 0, err
	}
	return s.st.OffsetForTime(t)
}

func (s *stream) FirstOffset() uint64 { return s.st.FirstOffset() }
func (s *stream) Committed() uint64   { return s.st.Committed() }

// Changed closes at the next advance of the replica's watermark (or other
// change of it), or when the stream closes.
func (s *stream) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.changed
}

// WriteState writes the stream's consumer state on its leader only: it
// stays on that node (doc.go, "What is left"), and a node that does not
// lead the stream refuses with mqtt.ErrLeaderUnavailable.
func (s *stream) WriteState(puts map[string][]byte, dels []string) error {
	if err := s.closedErr("write state of"); err != nil {
		return err
	}
	if s.leading() == nil {
		return fmt.Errorf("cluster: write state of %s: this node does not lead it: %w", s.name, mqtt.ErrLeaderUnavailable)
	}
	return s.st.WriteState(puts, dels)
}

// LoadState reads this node's copy of the stream's consumer state.
func (s *stream) LoadState(prefix string, fn func(key string, val []byte) error) error {
	if err := s.closedErr("load state of"); err != nil {
		return err
	}
	return s.st.LoadState(prefix, fn)
}

// StateMoved closes when this node becomes the stream's leader.
func (s *stream) StateMoved() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteLeaderLocked() // a move already made closes the channel the caller held, not this one
	return s.mu.moved
}

// Claim is decided by the stream's leader, for as long as it leads: a
// node that does not lead the stream grants nothing and names no holder.
func (s *stream) Claim(key, holder string) (ok bool, current string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.noteLeaderLocked() == nil {
		return false, ""
	}
	if h, held := s.mu.claims[key]; held && h != holder {
		return false, h
	}
	s.mu.claims[key] = holder
	return true, holder
}

// Unclaim gives key up if holder holds it.
func (s *stream) Unclaim(key, holder string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.claims[key] == holder {
		delete(s.mu.claims, key)
	}
}
