package rules

// The controller's answers to what Serf shows of each member (cluster's
// controller.go, reconcileAll): Serf tells who is alive, the state says
// what the controller last agreed about them.

// MemberCommand is the command the controller submits for broker id as
// Serf shows it, alive or not, in broker epoch epoch (0: not tagged
// yet), or nil: RegisterBroker for an alive member the state does not
// have alive in that epoch (a new broker, a restart, a return after a
// partition); BrokerFailed for a failed or departed member the state has
// alive in that epoch (a failure of another epoch is stale).
func MemberCommand(st *State, id string, epoch uint64, alive bool) Command {
	b := st.Brokers[id]
	switch {
	case alive && epoch != 0 && (b == nil || b.Epoch != epoch || !b.Alive):
		return RegisterBroker{ID: id, Epoch: epoch}
	case !alive && b != nil && b.Alive && b.Epoch == epoch:
		return BrokerFailed{ID: id, Epoch: epoch}
	}
	return nil
}

// Drained reports whether broker id, draining and failed, holds no
// replica: it was stopped after its decommission, and goes for good
// (RemoveBroker).
func Drained(st *State, id string) bool {
	b := st.Brokers[id]
	return b != nil && b.Draining && !b.Alive && len(st.ReplicaOf(id)) == 0
}

// Forget reports whether removed broker id leaves Raft's configuration
// and Serf: Serf does not show it alive, or a stream still names it (its
// replicas are being moved away). One that comes back alive once none
// does registers as a new, empty broker.
func Forget(st *State, id string, alive bool) bool {
	b := st.Brokers[id]
	return b != nil && b.Removed && (!alive || len(st.ReplicaOf(id)) > 0)
}
