package cluster

import (
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
	"github.com/peatmq/peat/cluster/rules"
)

// FSM is the controller's state machine: raft applies the committed
// Commands to it, in log order, on every voter.
type FSM struct {
	mu struct {
		sync.RWMutex
		state   *rules.State
		changed chan struct{} // closed and replaced by every change
	}
}

var _ raft.FSM = (*FSM)(nil)

// NewFSM returns an empty state machine.
func NewFSM() *FSM {
	f := &FSM{}
	f.mu.state = rules.NewState()
	f.mu.changed = make(chan struct{})
	return f
}

// Apply applies one committed entry. Its result, for the proposer, is nil
// or the error that refused the command (which changed nothing).
func (f *FSM) Apply(l *raft.Log) any {
	c, err := rules.DecodeCommand(l.Data)
	if err != nil {
		return err
	}
	return f.apply(c)
}

func (f *FSM) apply(c rules.Command) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Apply to a copy and keep it only on success: a refused command
	// changes nothing, even one refused half way through its checks.
	next, err := rules.Next(f.mu.state, c)
	if err != nil {
		return err
	}
	f.mu.state = next
	close(f.mu.changed)
	f.mu.changed = make(chan struct{})
	return nil
}

// State returns a copy of the current state and a channel closed at the
// next change.
func (f *FSM) State() (*rules.State, <-chan struct{}) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.mu.state.Clone(), f.mu.changed
}

// Watch returns the current state itself (as View does) and a channel
// closed at the next change: for a watcher that only reads.
func (f *FSM) Watch() (*rules.State, <-chan struct{}) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.mu.state, f.mu.changed
}

// View returns the current state itself, not a copy: apply and Restore
// replace it, never change it, so it stays as it is. For a look at a
// field or two on a hot path (a leader's fence on every watermark move);
// the caller must not change it. State returns a copy to change.
func (f *FSM) View() *rules.State {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.mu.state
}

// Snapshot captures the state for raft's snapshot store.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	b, err := rules.EncodeState(f.mu.state)
	if err != nil {
		return nil, err
	}
	return snapshot(b), nil
}

// Restore replaces the state with a snapshot's.
func (f *FSM) Restore(r io.ReadCloser) error {
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("cluster: restore: %w", err)
	}
	st, err := rules.DecodeState(b)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.state = st
	close(f.mu.changed)
	f.mu.changed = make(chan struct{})
	return nil
}

type snapshot []byte

func (s snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("cluster: persist snapshot: %w", err)
	}
	return sink.Close()
}

func (snapshot) Release() {}
