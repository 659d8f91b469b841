package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// subscriber reads everything it is sent, acknowledges QoS 1 deliveries, and
// keeps an exact record of which (publisher, sequence) pairs it has seen.
type subscriber struct {
	c    *conn
	w    *bufio.Writer
	seen [][]uint64 // per publisher, a bitset of sequences

	mu               sync.Mutex
	cond             *sync.Cond
	received, unique int64
	dups             int64
	lat              *samples
	exited           bool
}

func newSubscriber(c *conn, publishers, count int) *subscriber {
	s := &subscriber{c: c, w: bufio.NewWriterSize(c.NetConn(), 16<<10), lat: newSamples()}
	s.cond = sync.NewCond(&s.mu)
	s.seen = make([][]uint64, publishers)
	for i := range s.seen {
		s.seen[i] = make([]uint64, (count+63)/64)
	}
	return s
}

func (s *subscriber) run() {
	defer func() {
		s.mu.Lock()
		s.exited = true
		s.cond.Broadcast()
		s.mu.Unlock()
	}()
	var ackBuf bytes.Buffer
	for {
		pk, err := s.c.read()
		if err != nil {
			return
		}
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		now := time.Now().UnixNano()
		if pk.FixedHeader.Qos > 0 {
			ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID, ProtocolVersion: 4}
			ackBuf.Reset()
			_ = ack.PubackEncode(&ackBuf)
			_, _ = s.w.Write(ackBuf.Bytes())
			if s.c.Reader().Buffered() == 0 {
				_ = s.w.Flush()
			}
		}
		s.record(pk.Payload, now)
	}
}

func (s *subscriber) record(p []byte, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.received++
	if len(p) >= headerLen {
		pub := binary.BigEndian.Uint32(p)
		seq := binary.BigEndian.Uint64(p[4:])
		sent := int64(binary.BigEndian.Uint64(p[12:]))
		s.lat.addSent(now-sent, sent)
		if int(pub) < len(s.seen) && seq/64 < uint64(len(s.seen[pub])) {
			word, bit := &s.seen[pub][seq/64], uint64(1)<<(seq%64)
			if *word&bit != 0 {
				s.dups++
			} else {
				*word |= bit
				s.unique++
			}
		}
	}
	s.cond.Broadcast()
}

// waitFor waits until n distinct messages arrived, or nothing arrived for
// idle.
func (s *subscriber) waitFor(n int64, idle time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.unique < n && !s.exited {
		before := s.received
		t := time.AfterFunc(idle, func() {
			s.mu.Lock()
			s.cond.Broadcast()
			s.mu.Unlock()
		})
		s.cond.Wait()
		t.Stop()
		if s.received == before && s.unique < n {
			return // woken by the idle timer: nothing more is coming
		}
	}
}

func (s *subscriber) stop() {
	s.c.Close()
	s.mu.Lock()
	for !s.exited {
		s.cond.Wait()
	}
	s.mu.Unlock()
}
