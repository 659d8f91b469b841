package edge

import (
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// storeLog is the single-node log as the MQTT front-end sees it: the
// Store, with its *logstore.Stream as mqtt.Stream. That holds only while
// the store commits on its own (Config.ManualCommit false): AppendAsync's
// done then means committed, as mqtt.Stream promises; under ManualCommit
// it would mean written on this node only, and a cluster supplies its own
// mqtt.Log. TestStoreLog_Contract runs mqtt's contract suite against it.
type storeLog struct{ s *logstore.Store }

var (
	_ mqtt.Log    = storeLog{}
	_ mqtt.Stream = (*logstore.Stream)(nil)
)

// Route returns the stream capturing topic, or a nil interface (never a
// typed nil) when no stream does.
func (l storeLog) Route(topic string) mqtt.Stream {
	if s := l.s.Route(topic); s != nil {
		return s
	}
	return nil
}

// Stream returns the named stream, or a nil interface.
func (l storeLog) Stream(name string) mqtt.Stream {
	if s := l.s.Stream(name); s != nil {
		return s
	}
	return nil
}

// State is the store's consumer state.
func (l storeLog) State() mqtt.StateStore { return l.s }

func (l storeLog) Streams() []mqtt.Stream {
	ss := l.s.Streams()
	out := make([]mqtt.Stream, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// WatchStreams forwards the store's stream changes (Store.Watch).
func (l storeLog) WatchStreams() (<-chan mqtt.StreamEvent, func()) {
	in, cancel := l.s.Watch()
	return mqtt.ForwardStreamEvents(in, cancel, func(ev logstore.StreamEvent) mqtt.StreamEvent {
		return mqtt.StreamEvent{Kind: ev.Kind, Stream: ev.Stream}
	})
}
