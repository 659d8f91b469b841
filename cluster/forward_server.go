package cluster

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// produceQueue bounds the forwarded appends one produce connection may
// have unanswered on the leader; the reader waits beyond it.
const produceQueue = 2 * fwdWindow

// produce serves a produce pipeline: it reads requests without waiting
// for their answers, hands each to the stream's local append, and a
// writer sends the answers in request order (each slot is filled by its
// append's done, which the stream calls in call order; a refusal fills
// its slot at once, and still waits its turn).
func (s *Server) produce(c net.Conn, first []byte) {
	type slot struct {
		seq  uint64
		resp *wire.ProduceResponse // nil until answered
	}
	var mu sync.Mutex
	var q []*slot
	filled := make(chan struct{}, 1)
	free := make(chan struct{}, produceQueue)
	stop, wdone := make(chan struct{}), make(chan struct{})
	go func() { // the writer
		defer close(wdone)
		var out []byte
		bw := bufio.NewWriterSize(c, 32<<10) // the answers ready at once go in one write
		for {
			mu.Lock()
			var ready []*slot
			for len(q) > 0 && q[0].resp != nil {
				ready = append(ready, q[0])
				q = q[1:]
			}
			mu.Unlock()
			// A follower that reads no answer for as long as it would wait
			// for one has given the connection up, or is gone without a
			// reset: the connection is dropped rather than held by a write.
			_ = c.SetWriteDeadline(time.Now().Add(DefaultForwardTimeout))
			for _, sl := range ready {
				out = sl.resp.AppendTo(out[:0])
				if err := wire.WriteFrame(bw, wire.KindProduceResponse, out); err != nil {
					c.Close() // the reader ends too
					return
				}
			}
			if len(ready) > 0 {
				if err := bw.Flush(); err != nil {
					c.Close()
					return
				}
				for range ready {
					<-free
				}
			}
			select {
			case <-filled:
			case <-stop:
				return
			}
		}
	}()
	defer func() {
		close(stop)
		<-wdone
	}()
	body, buf := first, []byte(nil)
	for {
		var req wire.ProduceRequest
		if err := req.Decode(body); err != nil {
			s.log.Warn("cluster: bad produce request", slog.String("peer", c.RemoteAddr().String()), slog.Any("err", err))
			return
		}
		select {
		case free <- struct{}{}:
		case <-s.ctx.Done():
			return
		case <-wdone:
			return
		}
		sl := &slot{seq: req.Seq}
		mu.Lock()
		q = append(q, sl)
		mu.Unlock()
		answer := func(resp *wire.ProduceResponse) {
			mu.Lock()
			sl.resp = resp
			mu.Unlock()
			signal(filled)
		}
		recs := make([]*logstore.Record, len(req.Records))
		var err error
		for i, b := range req.Records {
			if recs[i], err = decodeFwdRecord(b); err != nil {
				break
			}
		}
		switch ls := s.leaderStream(req.Stream); {
		case err != nil:
			answer(produceResponse(req.Seq, 0, err))
		case ls == nil:
			answer(produceResponse(req.Seq, 0, errNotLeaderHere))
		default:
			// A forward sent again is answered as its first copy was
			// (forward_dedup.go).
			ls.seen.handle(req.From, req.Seq, answer, func(finish func(*wire.ProduceResponse)) {
				ls.appendProduced(&req, recs, finish)
			})
		}
		var kind byte
		kind, body, err = wire.ReadFrame(c, buf)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && s.ctx.Err() == nil {
				s.log.Info("cluster: produce connection", slog.String("peer", c.RemoteAddr().String()), slog.Any("err", err))
			}
			return
		}
		buf = body[:0]
		if kind != wire.KindProduceRequest {
			s.log.Warn("cluster: a produce connection sent another frame", slog.String("peer", c.RemoteAddr().String()), slog.Int("kind", int(kind)))
			return
		}
	}
}

// appendProduced appends a forward's records on the leader and passes
// the answer to finish.
func (s *stream) appendProduced(req *wire.ProduceRequest, recs []*logstore.Record, finish func(*wire.ProduceResponse)) {
	if len(req.Mirror) > 0 {
		in := make([]MirrorRecord, len(recs))
		for i, r := range recs {
			in[i] = MirrorRecord{Offset: req.Mirror[2*i], First: req.Mirror[2*i+1], Record: r}
		}
		seq := req.Seq
		s.mirrorForwarded(req.LeaderEpoch, in, func(res []MirrorResult, errs []error) {
			finish(mirrorResponse(seq, res, errs))
		})
		return
	}
	seq := req.Seq
	s.appendForwarded(req.LeaderEpoch, recs, func(first uint64, err error) {
		finish(produceResponse(seq, first, err))
	})
}

// produceResponse answers the forward seq: first is its first record's
// offset, or err why it was refused.
func produceResponse(seq, first uint64, err error) *wire.ProduceResponse {
	resp := &wire.ProduceResponse{Code: produceCode(err), Seq: seq, First: first}
	if rf, ok := errors.AsType[*mqtt.Refusal](err); ok {
		resp.Message = rf.Reason // the follower tells its producer the same reason
	} else if err != nil {
		resp.Message = err.Error()
	}
	return resp
}
