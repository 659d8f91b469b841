package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// Mirror streams in a site.
//
// A mirror stream (edge/mirror: another Peat's stream at its source's
// offsets) is replicated like any stream: created from the
// configuration, a leader, an ISR, min_insync_replicas. Its records
// cannot be appended as a publish is, since the leader would give them
// its own offsets; Log.Mirror takes them with their source offsets
// instead, and a stream that is a mirror refuses AppendAsync (mqtt
// routes no publish to it anyway):
//
//   - On the leader, the stream's mirrorWriter (started on first use)
//     takes what has queued (mirrorQueue), in call order, and runs
//     LogConfig.Mirror (edge/mirror.Apply: the rules against the leader's
//     log end, written with AppendReplica at that end, stamped with the
//     leader epoch) once for the lot; each call then waits, as an acks=all
//     append does, for the watermark to pass the highest offset it
//     appended or found already there (a duplicate not yet committed waits
//     too). The writer is admitted by the Leader like an append
//     (beginAppend), so Close waits for it and no record of an old epoch
//     lands after a truncation.
//   - On a follower, the records go down the produce pipeline with their
//     source offsets and starts (the wire's sixth ProduceRequest field),
//     and the answer carries one result per record; the call is answered
//     once this replica's watermark has passed them too.
//   - A call refused as a whole (no leader, leadership moved before the
//     records committed, the ISR too small, the forwarder's connection
//     lost) refuses every record: the sender (edge/sink/peatsink) sends
//     again from its position. A new leader may have truncated what the
//     old one had not committed, or hold it: the resends are appended or
//     acknowledged as duplicates, and a record beyond its end is refused
//     until the missing ones come. No offset holds two records, and each
//     sits at its source offset, on every replica.
//
// edge refuses acks: leader and unclean_leader_election on a mirror: a
// record acknowledged and then lost would leave a hole that the sender,
// already past it, never fills, and the mirror would refuse every later
// record.

// MirrorRecord is a record for a mirror stream (edge/mirror), at its
// offset in the source stream.
type MirrorRecord struct {
	Offset uint64 // in the source
	First  uint64 // the source's log start when it was sent
	Record *logstore.Record
}

// MirrorResult says what became of one MirrorRecord.
type MirrorResult uint8

const (
	MirrorAppended  MirrorResult = MirrorResult(wire.MirrorAppended)
	MirrorDuplicate MirrorResult = MirrorResult(wire.MirrorDuplicate) // below the log end: not appended again
	MirrorRefused   MirrorResult = MirrorResult(wire.MirrorRefused)
)

// MirrorApply writes in, in order, into st at the source's offsets,
// stamping epoch on what it appends, and says what became of each record
// (with the refusals' errors): edge/mirror's Apply, the rules. Everything
// reported appended or duplicate is written when it returns.
type MirrorApply func(ctx context.Context, st *logstore.Stream, epoch uint32, in []MirrorRecord) ([]MirrorResult, []error)

// ErrNotMirror refuses a mirror append to a stream that is not a mirror
// here, or an ordinary append to one.
var ErrNotMirror = errors.New("cluster: not a mirror stream")

// mirrorJob is one mirror append waiting for the leader's mirror writer.
type mirrorJob struct {
	p   *pendingAppend
	ld  *Leader
	in  []MirrorRecord
	out *mirrorOut
}

// mirrorQueue is a leader's mirror appends on their way to the mirror
// rules, in call order: mirrorAsync queues them under the stream's mu,
// and one writer goroutine (mirrorWriter), started on first use (most
// streams are no mirror), takes them. Lock order: the stream's mu, then
// the queue's.
type mirrorQueue struct {
	mu struct {
		sync.Mutex
		jobs    []mirrorJob
		running bool // the writer was started
		closed  bool // set with the stream's closed: no job is queued after it
	}
	kick chan struct{} // cap 1: a job was queued
}

func newMirrorQueue() *mirrorQueue { return &mirrorQueue{kick: make(chan struct{}, 1)} }

// push queues j and wakes the writer; start is true the first time: the
// caller starts the writer.
func (q *mirrorQueue) push(j mirrorJob) (start bool) {
	q.mu.Lock()
	q.mu.jobs = append(q.mu.jobs, j)
	start = !q.mu.running
	q.mu.running = true
	q.mu.Unlock()
	signal(q.kick)
	return start
}

// take is every job queued, and whether the queue is closed (then no
// other comes).
func (q *mirrorQueue) take() (jobs []mirrorJob, closed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	jobs, q.mu.jobs = q.mu.jobs, nil
	return jobs, q.mu.closed
}

// close is called with the stream's mu held, as it closes.
func (q *mirrorQueue) close() {
	q.mu.Lock()
	q.mu.closed = true
	q.mu.Unlock()
}

// mirrorOut is what became of a mirror append's records: filled by the
// leader's writer or the forwarder's reader before the append settles.
type mirrorOut struct {
	res  []MirrorResult
	errs []error
}

// Mirror writes in into the mirror stream name through its leader, and
// returns once each record is committed in the site (below the high
// watermark, as an acks=all append) or refused, with what became of it.
// The rules (LogConfig.Mirror) run on the leader against its log end; a
// follower forwards the records with their source offsets. A refusal of
// the whole call (no leader, leadership moved, the ISR below
// min_insync_replicas, ctx ended) refuses every record: the sender sends
// them again, and what was written meanwhile comes back as duplicates.
func (l *Log) Mirror(ctx context.Context, name string, in []MirrorRecord) ([]MirrorResult, []error) {
	s := l.stream(name)
	switch {
	case s == nil:
		return refuseAll(len(in), fmt.Errorf("cluster: mirror %s: not served on this node (yet): %w", name, mqtt.ErrLeaderUnavailable))
	case name == SessionsStream || !s.st.Mirror():
		return refuseAll(len(in), fmt.Errorf("cluster: mirror %s: %w", name, ErrNotMirror))
	}
	for _, x := range in {
		if x.Record == nil {
			return refuseAll(len(in), fmt.Errorf("cluster: mirror %s: %w", name, logstore.ErrNilRecord))
		}
	}
	// In calls of at most mirrorChunk bytes, queued in order: a forwarded
	// call is one frame (wire.MaxFrame), and a sender's window of large
	// records could pass it.
	type call struct {
		from, to int
		ch       chan struct{}
	}
	res, errs := make([]MirrorResult, len(in)), make([]error, len(in))
	var calls []call
	for from := 0; from < len(in); {
		to, size := from, 0
		for to < len(in) && (to == from || size+in[to].Record.Size() <= mirrorChunk) {
			size += in[to].Record.Size()
			to++
		}
		c := call{from: from, to: to, ch: make(chan struct{})}
		calls = append(calls, c)
		s.mirrorAsync(in[from:to], func(r []MirrorResult, e []error) {
			copy(res[c.from:c.to], r)
			copy(errs[c.from:c.to], e)
			close(c.ch)
		}, true, 0)
		from = to
	}
	for _, c := range calls {
		select {
		case <-c.ch:
		case <-ctx.Done():
			return refuseAll(len(in), fmt.Errorf("cluster: mirror %s: %w", name, ctx.Err()))
		}
	}
	return res, errs
}

// mirrorChunk bounds the records of one mirror call (Log.Mirror).
const mirrorChunk = 8 << 20

func refuseAll(n int, err error) ([]MirrorResult, []error) {
	res, errs := make([]MirrorResult, n), make([]error, n)
	for i := range res {
		res[i], errs[i] = MirrorRefused, err
	}
	return res, errs
}

// Mirror reports whether the stream is a mirror: mqtt refuses ordinary
// publishes routed to it.
func (s *stream) Mirror() bool { return s.st.Mirror() }

// mirrorAsync is AppendAsync for a mirror stream: the records keep their
// source offsets, and done gets each one's result, in call order, once
// the appended and duplicate ones are below the watermark (on a
// follower, its own too, so that a reader there sees them). forward is
// false for an append a follower forwarded here, in leader epoch epoch.
func (s *stream) mirrorAsync(in []MirrorRecord, done func([]MirrorResult, []error), forward bool, epoch uint32) {
	out := &mirrorOut{res: make([]MirrorResult, len(in)), errs: make([]error, len(in))}
	pdone := func(_ uint64, err error) {
		if err != nil { // not known committed: all of it is sent again
			done(refuseAll(len(in), err))
			return
		}
		done(out.res, out.errs)
	}
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		pdone(0, fmt.Errorf("cluster: mirror %s: %w", s.name, logstore.ErrClosed))
		return
	}
	p := &pendingAppend{done: pdone}
	s.mu.pending = append(s.mu.pending, p)
	if s.l.cfg.Mirror == nil {
		p.err = fmt.Errorf("cluster: mirror %s: this node applies no mirror rules: %w", s.name, ErrNotMirror)
	} else {
		s.admitOrHoldLocked(p, forwardedIn(forward, epoch), func(ld *Leader) { s.admitMirrorLocked(p, ld, in, out, forward, epoch) })
	}
	s.mu.Unlock()
	s.wake()
}

// admitMirrorLocked queues p's records for the mirror rules or sends them
// to the leader, under mu, so that they go in call order.
func (s *stream) admitMirrorLocked(p *pendingAppend, ld *Leader, in []MirrorRecord, out *mirrorOut, forward bool, epoch uint32) {
	if !forward && ld != nil && ld.epoch != epoch { // it waited for a Leader of another epoch
		p.err = wrongEpoch("mirror", s.name, epoch, ld)
		return
	}
	var recs []*logstore.Record // only a forwarded call sends them as they are
	if ld == nil && forward {
		recs = mirrorRecords(in)
	}
	fr := s.admitLocked(p, ld, "mirror", forward, recs)
	switch {
	case p.leader != nil:
		if s.mirrorQ.push(mirrorJob{p: p, ld: ld, in: in, out: out}) {
			s.mirrorRun.Add(1) // drain waits for it
			go s.mirrorWriter()
		}
	case p.fwd:
		fr.mirror, fr.out = in, out
		s.fwd.send(fr, "mirror")
	}
}

func mirrorRecords(in []MirrorRecord) []*logstore.Record {
	recs := make([]*logstore.Record, len(in))
	for i, x := range in {
		recs[i] = x.Record
	}
	return recs
}

// mirrorWriter is the leader's side: it applies the queued mirror appends
// in call order, what has queued meanwhile in one Apply (one commit), and
// settles each with the end of what it appended or found there, which
// answer then waits for the watermark to pass. It runs until close, and
// applies what was queued before it: an Apply is not cut short, so the
// Leader's Close (which waits for it) never returns with a write of its
// epoch still on its way.
func (s *stream) mirrorWriter() {
	defer s.mirrorRun.Done()
	for {
		jobs, closed := s.mirrorQ.take()
		if len(jobs) == 0 {
			if closed {
				return
			}
			select {
			case <-s.mirrorQ.kick:
			case <-s.stop:
			}
			continue
		}
		for len(jobs) > 0 { // one Apply per Leader, stamped with its epoch
			n := 1
			for n < len(jobs) && jobs[n].ld == jobs[0].ld {
				n++
			}
			s.applyMirror(jobs[:n])
			jobs = jobs[n:]
		}
	}
}

// applyMirror runs the rules for jobs, all taken under one Leader.
func (s *stream) applyMirror(jobs []mirrorJob) {
	ld := jobs[0].ld
	var in []MirrorRecord
	for _, j := range jobs {
		in = append(in, j.in...)
	}
	res, errs := s.l.cfg.Mirror(context.Background(), s.st, ld.epoch, in)
	i := 0
	for _, j := range jobs {
		var end uint64
		for k := range j.in {
			j.out.res[k], j.out.errs[k] = res[i], errs[i]
			if res[i] != MirrorRefused {
				end = max(end, j.in[k].Offset+1)
			}
			i++
		}
		ld.endAppend()
		s.settle(j.p, appendResult{end: end})
	}
}

// mirrorForwarded is the leader's side of a follower's forwarded mirror
// append, made in the leader epoch the follower believes in.
func (s *stream) mirrorForwarded(epoch uint32, in []MirrorRecord, done func([]MirrorResult, []error)) {
	if ld := s.leading(); ld != nil && ld.epoch != epoch {
		done(refuseAll(len(in), wrongEpoch("mirror", s.name, epoch, ld)))
		return
	}
	if !s.st.Mirror() {
		done(refuseAll(len(in), fmt.Errorf("cluster: mirror %s: %w", s.name, ErrNotMirror)))
		return
	}
	s.mirrorAsync(in, done, false, epoch)
}

// mirrorResponse is the leader's answer to a forwarded mirror append:
// the results, and why the first refused record was.
func mirrorResponse(seq uint64, res []MirrorResult, errs []error) *wire.ProduceResponse {
	resp := &wire.ProduceResponse{Seq: seq, Results: make([]byte, len(res))}
	for i, r := range res {
		resp.Results[i] = byte(r)
		if r == MirrorRefused && resp.Message == "" && errs[i] != nil {
			resp.Message = errs[i].Error()
		}
	}
	return resp
}

// mirrorAnswered fills r's results from the leader's answer; it returns
// the end the follower's watermark must pass, or an error when the answer
// does not fit the request.
func (r *fwdReq) mirrorAnswered(stream string, resp *wire.ProduceResponse) (uint64, error) {
	if len(resp.Results) != len(r.mirror) {
		return 0, fmt.Errorf("%d mirror results for %d records", len(resp.Results), len(r.mirror))
	}
	var end uint64
	for i, x := range resp.Results {
		r.out.res[i] = MirrorResult(x)
		if x == wire.MirrorRefused {
			r.out.errs[i] = fmt.Errorf("cluster: mirror %s: the leader refused offset %d: %s", stream, r.mirror[i].Offset, resp.Message)
		} else {
			end = max(end, r.mirror[i].Offset+1)
		}
	}
	return end, nil
}

// mirrorPositions is the wire's Mirror field for in.
func mirrorPositions(in []MirrorRecord) []uint64 {
	out := make([]uint64, 0, 2*len(in))
	for _, x := range in {
		out = append(out, x.Offset, x.First)
	}
	return out
}
