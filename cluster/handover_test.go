package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// ackedProducer appends one record at a time to s until stopped, keeping
// what was acknowledged (offset -> topic) and counting refusals with
// ErrLeaderUnavailable.
type ackedProducer struct {
	mu      sync.Mutex
	acked   map[uint64]string
	refused int
	stop    chan struct{}
	done    chan struct{}
}

func produceAcked(t *testing.T, s mqtt.Stream) *ackedProducer {
	p := &ackedProducer{acked: map[uint64]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			default:
			}
			topic := fmt.Sprintf("s/p/%d", i)
			ch := make(chan error, 1)
			var first uint64
			s.AppendAsync([]*logstore.Record{{Topic: topic, QoS: 1, Payload: []byte(topic)}},
				func(f uint64, err error) { first = f; ch <- err })
			err := <-ch
			p.mu.Lock()
			switch {
			case err == nil:
				p.acked[first] = topic
			case errors.Is(err, mqtt.ErrLeaderUnavailable):
				p.refused++
			}
			p.mu.Unlock()
			if err != nil {
				time.Sleep(time.Millisecond) // as a client would before it resends
			}
		}
	}()
	t.Cleanup(p.end)
	return p
}

func (p *ackedProducer) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
}

// end stops the producer; idempotent.
func (p *ackedProducer) end() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// TestLog_HandOverKeepsAcksLeaderRecords: on an acks: leader stream whose
// followers fetch slowly, the leader acknowledges records they do not
// hold yet; a graceful stop of the leader (the hand-over, then close)
// still leaves every acknowledged record on the new leader at the offset
// it was acknowledged with, and appends meanwhile are refused as while
// leadership moves (ErrLeaderUnavailable), not acknowledged and lost.
func TestLog_HandOverKeepsAcksLeaderRecords(t *testing.T) {
	fnet := faultnet.New()
	cfg := LogConfig{AcksLeader: func(s string) bool { return s == "s" }}
	leader, others, kill := fwdSiteNet(t, 2, cfg, fnet)
	for _, f := range others {
		fnet.Delay(f.node.ID(), leader.node.ID(), 300*time.Millisecond)
	}
	p := produceAcked(t, leader.log.Route("s/x"))
	ls := leader.store.Stream("s")
	eventually(t, "the leader acknowledges records no follower holds yet", func() bool {
		end := ls.NextOffset()
		for _, f := range others {
			if f.store.Stream("s").NextOffset() >= end {
				return false
			}
		}
		return p.count() > 50
	})

	handOver(leader.node, leader.log, handOverTimeout, slog.New(slog.DiscardHandler))
	p.end()
	kill(leader)

	next := others[0] // the first ISR member in replica order after the leader
	eventually(t, next.node.ID()+" leads", func() bool {
		st, _ := next.node.State()
		return st.Streams["s"].Leader == next.node.ID() && next.log.Stream("s").(*stream).leading() != nil
	})
	var top uint64
	for off := range p.acked {
		top = max(top, off+1)
	}
	ns := next.store.Stream("s")
	if end := ns.NextOffset(); end < top {
		t.Fatalf("the new leader's log ends at %d: %d acknowledged records up to offset %d lost", end, top-end, top)
	}
	eventually(t, "the new leader commits every acknowledged record", func() bool { return ns.Committed() >= top })
	recs, err := ns.Read(0, int(top), 0)
	if err != nil || uint64(len(recs)) != top {
		t.Fatalf("the new leader reads %d of %d records: %v", len(recs), top, err)
	}
	for off, topic := range p.acked {
		if got := recs[off].Topic; got != topic {
			t.Fatalf("offset %d: the new leader holds %s, %s was acknowledged there", off, got, topic)
		}
	}
	if p.refused == 0 {
		t.Errorf("no append was refused while the leader handed over")
	}
	t.Logf("%d acknowledged, %d refused during the hand-over", len(p.acked), p.refused)
}
