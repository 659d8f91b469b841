package mqtttest

import (
	"fmt"
	"sync"
)

// memStreamState is a MemStream's own consumer state (mqtt.Stream's
// WriteState, LoadState, StateMoved, Claim and Unclaim), as logstore keeps
// it per stream: gone with the stream, refused once it is closed.
type memStreamState struct {
	MemState
	moved struct {
		sync.Mutex
		ch chan struct{}
	}
	claims struct {
		sync.Mutex
		m map[string]string
	}
}

func newMemStreamState() *memStreamState {
	st := &memStreamState{}
	st.mu.m = map[string][]byte{}
	st.moved.ch = make(chan struct{})
	st.claims.m = map[string]string{}
	return st
}

// WriteState sets puts and deletes dels in the stream's state, atomically.
func (s *MemStream) WriteState(puts map[string][]byte, dels []string) error {
	if err := s.state.WriteState(puts, dels); err != nil {
		return fmt.Errorf("stream %s: %w", s.name, err)
	}
	return nil
}

// LoadState calls fn for every entry of the stream's state under prefix,
// in key order.
func (s *MemStream) LoadState(prefix string, fn func(key string, val []byte) error) error {
	if err := s.state.LoadState(prefix, fn); err != nil {
		return fmt.Errorf("stream %s: %w", s.name, err)
	}
	return nil
}

// StateValue returns the stream's state under key, for assertions.
func (s *MemStream) StateValue(key string) ([]byte, bool) { return s.state.Value(key) }

// StateMoved returns a channel closed by the next MoveState.
func (s *MemStream) StateMoved() <-chan struct{} {
	s.state.moved.Lock()
	defer s.state.moved.Unlock()
	return s.state.moved.ch
}

// MoveState changes the stream's state as a cluster does when leadership
// of the stream moves to this node or a replica applies the leader's
// state: the write comes from elsewhere, and StateMoved fires so that
// readers caching the state load it again.
func (s *MemStream) MoveState(puts map[string][]byte, dels []string) error {
	if err := s.WriteState(puts, dels); err != nil {
		return err
	}
	s.state.moved.Lock()
	close(s.state.moved.ch)
	s.state.moved.ch = make(chan struct{})
	s.state.moved.Unlock()
	return nil
}

// Claim makes holder the holder of key unless another holds it (ok false,
// current naming that holder).
func (s *MemStream) Claim(key, holder string) (ok bool, current string) {
	c := &s.state.claims
	c.Lock()
	defer c.Unlock()
	if h, held := c.m[key]; held && h != holder {
		return false, h
	}
	c.m[key] = holder
	return true, holder
}

// Unclaim gives key up if holder holds it.
func (s *MemStream) Unclaim(key, holder string) {
	c := &s.state.claims
	c.Lock()
	defer c.Unlock()
	if c.m[key] == holder {
		delete(c.m, key)
	}
}

// closeState makes the state refuse every call with logstore.ErrClosed.
func (s *MemStream) closeState() {
	s.state.mu.Lock()
	s.state.mu.closed = true
	s.state.mu.Unlock()
}
