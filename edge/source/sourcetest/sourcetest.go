// Package sourcetest holds what the tests of the kinds of source share:
// a log of mqtttest's memory streams or of a logstore.Store as the source
// framework finds its streams, and marks kept in memory.
package sourcetest

import (
	"sync"

	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// MemLog is an mqtttest.MemLog as a source.Log.
type MemLog struct{ L *mqtttest.MemLog }

func (l MemLog) Stream(name string) source.Stream {
	if s := l.L.Lookup(name); s != nil {
		return s
	}
	return nil
}

func (l MemLog) Route(topic string) string {
	if s := l.L.Route(topic); s != nil {
		return s.Name()
	}
	return ""
}

// StoreLog is a logstore.Store, a node's store, as a source.Log.
type StoreLog struct{ St *logstore.Store }

func (l StoreLog) Stream(name string) source.Stream {
	if s := l.St.Stream(name); s != nil {
		return s
	}
	return nil
}

func (l StoreLog) Route(topic string) string {
	if s := l.St.Route(topic); s != nil {
		return s.Name()
	}
	return ""
}

// Marks keeps the sources' marks (source.Positions) in memory; the zero
// value is ready.
type Marks struct {
	mu sync.Mutex
	m  map[string]uint64
}

func (m *Marks) Load(group, stream string) (uint64, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	off, ok := m.m[group+"/"+stream]
	return off, ok, nil
}

func (m *Marks) Commit(group, stream string, off uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[string]uint64{}
	}
	m.m[group+"/"+stream] = off
	return nil
}
