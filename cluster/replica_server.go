package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	"github.com/peatmq/peat/cluster/wire"
)

// Server answers followers' fetch and epoch requests for the streams this
// node leads (Lead, Resign), one goroutine per connection, each request
// answered before the next is read. Close stops them all and waits.
type Server struct {
	ln     net.Listener
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	node   *Node // answers commands; nil: NotController
	wg     sync.WaitGroup

	mu struct {
		sync.Mutex
		leaders map[string]*Leader
		log     *Log // answers the data plane's requests; nil: NotLeader
		conns   map[net.Conn]struct{}
		closed  bool
	}
}

// Serve starts answering on ln.
func Serve(ln net.Listener, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{ln: ln, log: log}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.mu.leaders = map[string]*Leader{}
	s.mu.conns = map[net.Conn]struct{}{}
	s.wg.Add(1)
	go s.accept()
	return s
}

// ServeNode answers controller commands (Node.Submit) with n. Until it is
// called they are answered NotController, which submitters retry.
func (s *Server) ServeNode(n *Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.node = n
}

// serveLog answers forwarded appends, state writes, state fetches and
// claims with l's streams (nil: NotLeader).
func (s *Server) serveLog(l *Log) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.log = l
}

// leaderStream is the stream of the Log this Server answers for.
func (s *Server) leaderStream(name string) *stream {
	s.mu.Lock()
	l := s.mu.log
	s.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.stream(name)
}

// Addr is the address followers dial.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Lead serves l's stream from now on (replacing an earlier leader of it).
func (s *Server) Lead(l *Leader) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.leaders[l.stream.Name()] = l
}

// Resign stops serving stream (its fetches get NotLeader).
func (s *Server) Resign(stream string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mu.leaders, stream)
}

func (s *Server) leader(stream string) *Leader {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.leaders[stream]
}

// Close stops accepting, closes every connection and waits for their
// goroutines. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.closed = true
	for c := range s.mu.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.cancel()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) && s.ctx.Err() == nil {
				s.log.Error("cluster: replication accept", slog.Any("err", err))
			}
			return
		}
		s.mu.Lock()
		if s.mu.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.mu.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.mu.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	var buf, out []byte
	for {
		kind, body, err := wire.ReadFrame(c, buf)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && s.ctx.Err() == nil {
				s.log.Info("cluster: replication connection", slog.String("peer", c.RemoteAddr().String()), slog.Any("err", err))
			}
			return
		}
		buf = body[:0]
		if kind == wire.KindProduceRequest {
			s.produce(c, body) // the connection is a produce pipeline from now on
			return
		}
		var rkind byte
		rkind, out, err = s.handle(kind, body, out[:0])
		if err != nil {
			s.log.Warn("cluster: bad replication request", slog.String("peer", c.RemoteAddr().String()), slog.Any("err", err))
			return // a peer that speaks garbage loses its connection
		}
		if err := wire.WriteFrame(c, rkind, out); err != nil {
			return
		}
	}
}

// servedNode is the Node whose commands and heartbeats the Server
// answers (ServeNode), nil before.
func (s *Server) servedNode() *Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.node
}

// handle answers one request frame.
func (s *Server) handle(kind byte, body, out []byte) (byte, []byte, error) {
	switch kind {
	case wire.KindFetchRequest:
		var req wire.FetchRequest
		if err := req.Decode(body); err != nil {
			return 0, nil, err
		}
		var resp wire.FetchResponse
		if l := s.leader(req.Stream); l != nil {
			resp = l.fetch(s.ctx, &req)
		} else {
			resp.Code = wire.NotLeader
		}
		return wire.KindFetchResponse, resp.AppendTo(out), nil
	case wire.KindEpochRequest:
		var req wire.EpochRequest
		if err := req.Decode(body); err != nil {
			return 0, nil, err
		}
		var resp wire.EpochResponse
		if l := s.leader(req.Stream); l != nil {
			resp = l.endForEpoch(&req)
		} else {
			resp.Code = wire.NotLeader
		}
		return wire.KindEpochResponse, resp.AppendTo(out), nil
	case wire.KindCommandRequest:
		var req wire.CommandRequest
		if err := req.Decode(body); err != nil {
			return 0, nil, err
		}
		resp := wire.CommandResponse{Code: wire.NotController}
		if n := s.servedNode(); n != nil {
			resp = n.handleCommand(s.ctx, &req)
		}
		return wire.KindCommandResponse, resp.AppendTo(out), nil
	case wire.KindHeartbeatRequest:
		var req wire.HeartbeatRequest
		if err := req.Decode(body); err != nil {
			return 0, nil, err
		}
		resp := wire.HeartbeatResponse{Code: wire.NotController}
		if n := s.servedNode(); n != nil {
			resp = n.handleHeartbeat(&req)
		}
		return wire.KindHeartbeatResponse, resp.AppendTo(out), nil
	case wire.KindStateWriteRequest:
		var req wire.StateWriteRequest
		if err := req.Decode(body); err != nil {
			return 0, nil, err
		}
		resp := wire.StateWriteResponse{Code: wire.NotLeader}
		if ls := s.leaderStream(req.Stream); ls != nil {
			resp = ls.serveStateWrite(s.ctx, &req)
		}
		return wire.KindStateWriteResponse, resp.AppendTo(out), nil
	case wire.KindStateFetchRequest:
		var req wire.StateFetchRequest
		if err := req.Decode(body); err != nil {
			return 0, nil, err
		}
		resp := wire.StateFetchResponse{Code: wire.NotLeader}
		if ls := s.leaderStream(req.Stream); ls != nil {
			resp = ls.rs.serveFetch(s.ctx, &req)
		}
		return wire.KindStateFetchResponse, resp.AppendTo(out), nil
	case wire.KindClaimRequest:
		var req wire.ClaimRequest
		if err := req.Decode(body); err != nil {
			return 0, nil, err
		}
		resp := wire.ClaimResponse{Code: wire.NotLeader}
		if ls := s.leaderStream(req.Stream); ls != nil {
			resp = ls.claims.serve(&req)
		}
		return wire.KindClaimResponse, resp.AppendTo(out), nil
	}
	return 0, nil, fmt.Errorf("unknown frame kind %d", kind)
}
