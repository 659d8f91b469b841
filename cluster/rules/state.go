package rules

import (
	"fmt"
	"maps"
	"slices"
	"sort"
)

// State is the site metadata the controller agrees on through Raft.
type State struct {
	Brokers map[string]*Broker
	Streams map[string]*Stream

	// Deleted are the tombstones of deleted streams: name -> the
	// incarnation (Stream.Created) deleted (DeleteStream).
	Deleted map[string]uint64
	// Incarnations counts the streams ever created: the next creation is
	// Incarnations+1.
	Incarnations uint64
}

// Broker is one node as the controller knows it.
//
// Removed marks a broker that left the site for good (RemoveBroker): it
// is never alive again under that standing, the controller moves its
// replicas away and takes it out of Raft. The mark stays once its last
// replica has moved (so the controller still knows to keep it out of
// Raft); a node of that id registering after that is a new, empty broker.
//
// Draining marks a live broker being decommissioned (DrainBroker): it
// keeps serving while the controller moves its replicas away, is never
// given a new one, and becomes Removed once it holds none and has
// stopped. It survives the broker's restarts.
type Broker struct {
	ID       string
	Epoch    uint64 // changes on every start (Serf tag); fences an old incarnation
	Alive    bool
	Removed  bool
	Draining bool
	// Lists are the streams its configuration lists (ListStreams).
	Lists []string
}

// Leaving reports whether id is removed or draining: its replicas move
// away and it gets no new one.
func (s *State) Leaving(id string) bool {
	b := s.Brokers[id]
	return b != nil && (b.Removed || b.Draining)
}

// Stream is one stream's replication state.
//
// Leader is "" while no replica can lead (offline). ISR never becomes
// empty: when its last member fails it stays there, as Kafka keeps it, so
// the stream comes back under it, losing nothing, when it returns.
// LeaderEpoch grows with every change of leader; Version with every
// change of leader, ISR or replicas (the compare-and-set of AlterISR).
// ReplicationFactor is how many replicas the stream should have (0 in a
// state written before it existed: as many as it was created with).
type Stream struct {
	Name              string
	Replicas          []string
	Leader            string
	LeaderEpoch       uint32
	ISR               []string
	Version           uint64
	UncleanElection   bool
	ReplicationFactor int
	// Created tells this stream from an earlier, deleted one of the same
	// name (State.Incarnations at its creation; 0 for a stream created
	// before deletions existed).
	Created uint64
	// Moves are the replicas this stream is giving up to other brokers
	// (MoveReplicas, PlanRebalance): each target is added, catches up,
	// and the source leaves, as a draining broker's replica does.
	// Absent from states written before rebalancing existed.
	Moves []ReplicaMove `msgpack:",omitempty"`
}

// Want is how many replicas the stream should have.
func (st *Stream) Want() int {
	if st.ReplicationFactor > 0 {
		return st.ReplicationFactor
	}
	return len(st.Replicas)
}

// NewState is the state of a site with no broker and no stream.
func NewState() *State {
	return &State{Brokers: map[string]*Broker{}, Streams: map[string]*Stream{}}
}

// Clone is a deep copy: readers get one, never the state Apply changes.
func (s *State) Clone() *State {
	c := NewState()
	for id, b := range s.Brokers {
		bc := *b
		bc.Lists = slices.Clone(b.Lists)
		c.Brokers[id] = &bc
	}
	if s.Deleted != nil {
		c.Deleted = maps.Clone(s.Deleted)
	}
	c.Incarnations = s.Incarnations
	for n, st := range s.Streams {
		c.Streams[n] = st.Clone()
	}
	return c
}

// Clone is a deep copy of the stream.
func (st *Stream) Clone() *Stream {
	c := *st
	c.Replicas = slices.Clone(st.Replicas)
	c.ISR = slices.Clone(st.ISR)
	c.Moves = slices.Clone(st.Moves)
	return &c
}

// InISR reports whether id is in the stream's ISR.
func (st *Stream) InISR(id string) bool { return slices.Contains(st.ISR, id) }

// StreamNames in order: every rule that walks streams walks them in the
// same order on every node.
func (s *State) StreamNames() []string {
	names := make([]string, 0, len(s.Streams))
	for n := range s.Streams {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Alive reports whether broker id is known and alive.
func (s *State) Alive(id string) bool {
	b := s.Brokers[id]
	return b != nil && b.Alive
}

// Apply changes the state by c, or returns why not. A refused command
// may have changed part of s on its way to the refusal: apply to a Clone
// and keep it only on success (Next does), so that a refusal changes
// nothing, on every node alike. Every change may end a replica move
// (pruneMoves).
func (s *State) Apply(c Command) error {
	if err := s.applyCommand(c); err != nil {
		return err
	}
	s.pruneMoves()
	return nil
}

// Next is the state after c, a new one: s is left as it was, whether
// c is applied or refused.
func Next(s *State, c Command) (*State, error) {
	next := s.Clone()
	if err := next.Apply(c); err != nil {
		return nil, err
	}
	return next, nil
}

func (s *State) applyCommand(c Command) error {
	if ok, err := s.applyDeletion(c); ok {
		return err
	}
	switch c := c.(type) {
	case RegisterBroker:
		return s.registerBroker(c)
	case BrokerFailed:
		return s.brokerFailed(c)
	case CreateStream:
		return s.createStream(c)
	case AssignReplicas:
		return s.assignReplicas(c)
	case ElectLeader:
		return s.electLeader(c)
	case AlterISR:
		return s.alterISR(c)
	case RemoveBroker:
		return s.removeBroker(c)
	case DrainBroker:
		return s.drainBroker(c)
	case KeepBroker:
		return s.keepBroker(c)
	case SetReplicationFactor:
		return s.setReplicationFactor(c)
	case MoveReplicas:
		return s.moveReplicas(c)
	}
	return fmt.Errorf("%w: %T", ErrBadCommand, c)
}

func (s *State) registerBroker(c RegisterBroker) error {
	if c.ID == "" {
		return fmt.Errorf("%w: empty broker id", ErrBadCommand)
	}
	b := s.Brokers[c.ID]
	switch {
	case b == nil:
		s.Brokers[c.ID] = &Broker{ID: c.ID, Epoch: c.Epoch, Alive: true}
	case b.Removed && len(s.ReplicaOf(c.ID)) > 0:
		return fmt.Errorf("%w: %s: its replicas of %v are still being moved away", ErrRemovedBroker, c.ID, s.ReplicaOf(c.ID))
	case b.Removed && c.Epoch >= b.Epoch:
		// Back after its removal finished: a new broker that holds nothing.
		*b = Broker{ID: c.ID, Epoch: c.Epoch, Alive: true}
	case c.Epoch < b.Epoch:
		return fmt.Errorf("%w: %s registers epoch %d, known %d", ErrStaleBrokerEpoch, c.ID, c.Epoch, b.Epoch)
	case c.Epoch == b.Epoch:
		b.Alive = true // back after a partition, same incarnation
	default:
		// A restart: the old incarnation's place in the ISRs goes with it;
		// the new one rejoins them by catching up in its own epoch.
		b.Epoch, b.Alive = c.Epoch, true
		s.fence(c.ID)
	}
	s.electOffline()
	return nil
}

func (s *State) brokerFailed(c BrokerFailed) error {
	b := s.Brokers[c.ID]
	if b == nil {
		return fmt.Errorf("%w: %s", ErrUnknownBroker, c.ID)
	}
	if c.Epoch != b.Epoch {
		return fmt.Errorf("%w: %s failed in epoch %d, runs %d", ErrStaleBrokerEpoch, c.ID, c.Epoch, b.Epoch)
	}
	b.Alive = false
	s.fence(c.ID)
	return nil
}

// fence takes id out of every ISR it is not the last member of, and
// elects new leaders for the streams it led.
func (s *State) fence(id string) {
	for _, n := range s.StreamNames() {
		st := s.Streams[n]
		changed := false
		if len(st.ISR) > 1 && st.InISR(id) {
			st.ISR = slices.DeleteFunc(st.ISR, func(m string) bool { return m == id })
			changed = true
		}
		if st.Leader == id {
			s.elect(st, "", id)
			continue // elect moved the version
		}
		if changed {
			st.Version++
		}
	}
}

// electOffline gives a leader to the streams that have none, if one of
// their ISR (or, with UncleanElection, of their replicas) is alive.
func (s *State) electOffline() {
	for _, n := range s.StreamNames() {
		if st := s.Streams[n]; st.Leader == "" {
			s.elect(st, "", "")
		}
	}
}

// elect chooses st's leader: preferred if given, else the first alive ISR
// member in replica order other than exclude; with UncleanElection and no
// such member, the first alive replica, whose log becomes the stream's (the
// ISR shrinks to it). With no one eligible the stream goes offline. A
// change of leader moves LeaderEpoch and Version.
func (s *State) elect(st *Stream, preferred, exclude string) {
	leader := ""
	if preferred != "" {
		leader = preferred
	} else {
		for _, r := range st.Replicas {
			if r != exclude && st.InISR(r) && s.Alive(r) {
				leader = r
				break
			}
		}
	}
	if leader == "" && st.UncleanElection {
		for _, r := range st.Replicas {
			if r != exclude && s.Alive(r) {
				leader = r
				st.ISR = []string{r}
				break
			}
		}
	}
	if leader == st.Leader {
		return
	}
	st.Leader = leader
	st.LeaderEpoch++
	st.Version++
}

// checkReplicas checks a new replica list; a removed broker may only be
// in it if it is in had (a stream's current replicas, being moved away).
func (s *State) checkReplicas(replicas, had []string) error {
	if len(replicas) == 0 {
		return fmt.Errorf("%w: none", ErrBadReplicas)
	}
	seen := map[string]bool{}
	for _, r := range replicas {
		if seen[r] {
			return fmt.Errorf("%w: %s twice", ErrBadReplicas, r)
		}
		seen[r] = true
		b := s.Brokers[r]
		if b == nil {
			return fmt.Errorf("%w: %s", ErrUnknownBroker, r)
		}
		if (b.Removed || b.Draining) && !slices.Contains(had, r) {
			return fmt.Errorf("%w: %s (removed or being drained)", ErrRemovedBroker, r)
		}
	}
	return nil
}

// ReplicaOf names the streams that have id among their replicas.
func (s *State) ReplicaOf(id string) []string {
	var out []string
	for _, n := range s.StreamNames() {
		if slices.Contains(s.Streams[n].Replicas, id) {
			out = append(out, n)
		}
	}
	return out
}

func (s *State) removeBroker(c RemoveBroker) error {
	b := s.Brokers[c.ID]
	switch {
	case b == nil:
		return fmt.Errorf("%w: %s", ErrUnknownBroker, c.ID)
	case b.Removed:
		return nil
	case b.Alive:
		return fmt.Errorf("%w: %s: the controller counts it alive: stop it first, or wait until the site sees it failed "+
			"(only a node that is gone for good is removed)", ErrBrokerAlive, c.ID)
	}
	var sole []string
	for _, n := range s.StreamNames() {
		if st := s.Streams[n]; slices.Equal(st.ISR, []string{c.ID}) {
			sole = append(sole, n)
		}
	}
	if len(sole) > 0 {
		return fmt.Errorf("%w: %s is the only in-sync replica of %v: removing it would lose what they committed",
			ErrIneligibleReplica, c.ID, sole)
	}
	b.Removed = true
	return nil
}

// drainBroker marks c.ID draining, unless a stream it holds could not
// have its replication factor without it for want of alive brokers to
// move to: a decommission never leaves a stream under-replicated (lower
// the factor first, or add a broker).
func (s *State) drainBroker(c DrainBroker) error {
	b := s.Brokers[c.ID]
	switch {
	case b == nil:
		return fmt.Errorf("%w: %s", ErrUnknownBroker, c.ID)
	case b.Removed:
		return fmt.Errorf("%w: %s", ErrRemovedBroker, c.ID)
	case b.Draining:
		return nil
	}
	var short []string
	for _, n := range s.ReplicaOf(c.ID) {
		st := s.Streams[n]
		var keep int
		for _, r := range st.Replicas {
			if r != c.ID && !s.Leaving(r) {
				keep++
			}
		}
		free := 0
		for id, o := range s.Brokers {
			if id != c.ID && o.Alive && !o.Removed && !o.Draining && !slices.Contains(st.Replicas, id) {
				free++
			}
		}
		if keep+free < st.Want() {
			short = append(short, n)
		}
	}
	if len(short) > 0 {
		return fmt.Errorf("%w: draining %s would leave stream(s) %v under-replicated: no other alive broker to move "+
			"its replicas to (add a broker first, or lower their replication_factor)", ErrIneligibleReplica, c.ID, short)
	}
	b.Draining = true
	return nil
}

// keepBroker ends c.ID's drain (KeepBroker).
func (s *State) keepBroker(c KeepBroker) error {
	b := s.Brokers[c.ID]
	switch {
	case b == nil:
		return fmt.Errorf("%w: %s", ErrUnknownBroker, c.ID)
	case b.Removed:
		return fmt.Errorf("%w: %s was removed for good (drained and stopped, or dead): "+
			"start it again and it joins as a new, empty broker", ErrRemovedBroker, c.ID)
	}
	b.Draining = false
	return nil
}

func (s *State) setReplicationFactor(c SetReplicationFactor) error {
	st := s.Streams[c.Name]
	if st == nil {
		return fmt.Errorf("%w: %s", ErrUnknownStream, c.Name)
	}
	if c.ReplicationFactor < 1 {
		return fmt.Errorf("%w: replication factor %d", ErrBadCommand, c.ReplicationFactor)
	}
	st.ReplicationFactor = c.ReplicationFactor
	return nil
}

func (s *State) createStream(c CreateStream) error {
	if c.Name == "" {
		return fmt.Errorf("%w: empty stream name", ErrBadCommand)
	}
	if old := s.Streams[c.Name]; old != nil {
		if slices.Equal(old.Replicas, c.Replicas) && old.UncleanElection == c.UncleanElection {
			return nil
		}
		return fmt.Errorf("%w: %s", ErrStreamExists, c.Name)
	}
	if err := s.checkReplicas(c.Replicas, nil); err != nil {
		return err
	}
	if c.ReplicationFactor < 0 {
		return fmt.Errorf("%w: replication factor %d", ErrBadCommand, c.ReplicationFactor)
	}
	st := &Stream{Name: c.Name, Replicas: slices.Clone(c.Replicas), UncleanElection: c.UncleanElection,
		ReplicationFactor: c.ReplicationFactor}
	for _, r := range c.Replicas {
		if s.Alive(r) {
			st.ISR = append(st.ISR, r)
		}
	}
	if len(st.ISR) == 0 {
		return fmt.Errorf("%w: no replica of %s is alive", ErrIneligibleReplica, c.Name)
	}
	st.Leader, st.LeaderEpoch, st.Version = st.ISR[0], 1, 1
	s.Incarnations++
	st.Created = s.Incarnations
	s.Streams[c.Name] = st
	return nil
}

func (s *State) assignReplicas(c AssignReplicas) error {
	st := s.Streams[c.Name]
	if st == nil {
		return fmt.Errorf("%w: %s", ErrUnknownStream, c.Name)
	}
	if err := s.checkReplicas(c.Replicas, st.Replicas); err != nil {
		return err
	}
	isr := slices.DeleteFunc(slices.Clone(st.ISR), func(m string) bool { return !slices.Contains(c.Replicas, m) })
	if len(isr) == 0 {
		return fmt.Errorf("%w: %s: no member of the ISR %v among %v", ErrIneligibleReplica, c.Name, st.ISR, c.Replicas)
	}
	st.Replicas, st.ISR = slices.Clone(c.Replicas), isr
	st.Version++
	switch {
	case !slices.Contains(st.Replicas, st.Leader):
		s.elect(st, "", st.Leader) // not a replica any more: one of the rest
	case st.Leader == "":
		s.elect(st, "", "")
	}
	return nil
}

func (s *State) electLeader(c ElectLeader) error {
	st := s.Streams[c.Name]
	if st == nil {
		return fmt.Errorf("%w: %s", ErrUnknownStream, c.Name)
	}
	if c.Preferred != "" {
		if !st.InISR(c.Preferred) || !s.Alive(c.Preferred) {
			return fmt.Errorf("%w: %s is not an alive member of %s's ISR %v", ErrIneligibleReplica, c.Preferred, c.Name, st.ISR)
		}
		s.elect(st, c.Preferred, "")
		return nil
	}
	if st.Leader != "" && st.InISR(st.Leader) && s.Alive(st.Leader) {
		return nil
	}
	s.elect(st, "", st.Leader)
	return nil
}

func (s *State) alterISR(c AlterISR) error {
	st := s.Streams[c.Name]
	if st == nil {
		return fmt.Errorf("%w: %s", ErrUnknownStream, c.Name)
	}
	if c.Leader == "" || c.Leader != st.Leader || c.LeaderEpoch != st.LeaderEpoch {
		return fmt.Errorf("%w: %s: %s in epoch %d, the leader is %s in epoch %d",
			ErrStaleLeaderEpoch, c.Name, c.Leader, c.LeaderEpoch, st.Leader, st.LeaderEpoch)
	}
	if c.Version != st.Version {
		return fmt.Errorf("%w: %s: version %d, current %d", ErrStaleVersion, c.Name, c.Version, st.Version)
	}
	var isr []string
	for _, m := range c.ISR {
		b := s.Brokers[m.ID]
		switch {
		case !slices.Contains(st.Replicas, m.ID) || slices.Contains(isr, m.ID):
			return fmt.Errorf("%w: %s: %s is not a replica, or named twice", ErrIneligibleReplica, c.Name, m.ID)
		case b == nil || b.Epoch != m.Epoch:
			return fmt.Errorf("%w: %s: %s caught up in epoch %d", ErrStaleBrokerEpoch, c.Name, m.ID, m.Epoch)
		case !b.Alive:
			return fmt.Errorf("%w: %s: %s has failed", ErrIneligibleReplica, c.Name, m.ID)
		}
		isr = append(isr, m.ID)
	}
	if !slices.Contains(isr, c.Leader) {
		return fmt.Errorf("%w: %s: the leader %s must stay in the ISR", ErrIneligibleReplica, c.Name, c.Leader)
	}
	// Replica order, so that elections and comparisons see one order.
	st.ISR = slices.DeleteFunc(slices.Clone(st.Replicas), func(r string) bool { return !slices.Contains(isr, r) })
	st.Version++
	return nil
}
