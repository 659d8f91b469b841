// Package rules holds a site's replication rules, Kafka's and KRaft's,
// as pure functions of state: no network, no Raft, no Serf, no store and
// no clock (pure_test.go fails on a change that adds one). Package
// cluster runs the loops that talk to all of those and calls in here
// with what they saw and the time.
//
// # The controller's state (state.go, commands.go, delete.go, rebalance.go, members.go)
//
// State holds each broker's epoch and liveness and each stream's
// replicas, leader, ISR, leader epoch and version. A Command changes it:
// cluster's Raft FSM applies each committed one with Next, on a copy it
// keeps only on success, so a refused command changes nothing, on every
// node alike.
//
//  1. A leader comes from the ISR only, alive, first in replica order;
//     with UncleanElection (per stream) and no such member, the first
//     alive replica, whose log then becomes the stream's (elect).
//  2. The ISR never becomes empty: its last member stays when it fails,
//     the stream goes offline (no leader) and comes back under that
//     member, losing nothing, when it returns.
//  3. AlterISR is a compare-and-set: refused unless the leader, its
//     leader epoch and the stream version are the current ones (a
//     deposed leader never shrinks the ISR), and every member is an
//     alive replica in the broker epoch named.
//  4. A broker registering a higher epoch (a restart), or reported
//     failed in its current one, is fenced: out of every ISR it is not
//     the last member of, and its streams elect new leaders. A lower
//     epoch, or a failure report of another epoch, is stale and refused.
//  5. LeaderEpoch grows with every change of leader; Version with every
//     change of leader, ISR or replicas.
//  6. RemoveBroker marks a broker gone for good: refused while it is
//     alive, or while it is a stream's only ISR member (it alone holds
//     what was committed). A removed broker is never added to a replica
//     set and cannot register while a stream names it; once none does,
//     it registers as a new, empty broker. The mark stays, so that every
//     controller keeps it out of Raft.
//  7. DrainBroker marks a live broker draining (a decommission): never
//     given a replica again, kept across its restarts, refused when a
//     stream it holds could not keep its replication factor on the
//     other alive brokers. KeepBroker ends a drain; the moved replicas
//     stay. SetReplicationFactor changes a stream's factor (at least 1).
//  8. MoveReplicas records replica moves (Stream.Moves) of streams with
//     a leader and no move under way, from an alive replica to an alive
//     broker outside the replicas, neither leaving; one bad move refuses
//     them all. A move ends when its source leaves the replicas and is
//     dropped when its source or target fails, is removed or drains
//     (pruneMoves, after every command).
//  9. DeleteStream removes a stream and leaves a tombstone naming the
//     incarnation deleted (State.Deleted; Stream.Created counts
//     creations), refused while a broker not removed lists the stream in
//     its configuration (ListStreams): it would create it again.
//
// The controller turns Serf's view of each member into commands
// (members.go): MemberCommand registers an alive member the state does
// not have alive in its epoch and reports failed one the state has alive
// in its epoch; Drained names a decommissioned broker that stopped
// (RemoveBroker), Forget a removed one that leaves Raft and Serf.
//
// Raft entries are one kind byte, then the command as msgpack
// (EncodeCommand); snapshots are the State as msgpack (EncodeState).
// Fields added later decode as zero from older states. Kinds are never
// renumbered: the later ones have explicit values (16-19, 32-33). A node
// of an older version cannot decode a newer kind: as controller it
// refuses it (ErrBadCommand), as follower its state lacks the change.
// Every node is upgraded before a new command is used.
//
// # Moving replicas (plan_moves.go, rebalance.go, replace.go, leaders.go)
//
// PlanMoves is the controller's reassignment, Kafka's add first and
// remove after, one AssignReplicas per stream that needs one:
//
//  1. A stream with fewer replicas outside the leaving brokers (removed
//     or draining) than its factor gets new ones on alive brokers
//     outside its set, the least loaded first, ties from a place its
//     name decides (PickReplicas spreads new streams' leaders the same
//     way); a new one takes a leaving one's rank, a move's target its
//     source's.
//  2. A stream with more drops the extra ones: never the leader, the
//     dead first, then those outside the ISR, then the last in replica
//     order.
//  3. A leaving replica goes only once every alive replica kept is in
//     the ISR. A removed (dead) one goes anyway when no broker is left
//     to move to; a draining one, or a move's source, only once the
//     stream has its factor on kept replicas all alive and in sync: a
//     decommission is never an under-replicated moment. If it leads, the
//     first kept ISR member takes over in the same command, unless its
//     leader (acks: leader) hands over itself first: PlanMovesHeld holds
//     that step for up to a limit, counted while the leader is leaving.
//  4. An offline stream (no leader to copy from) is left alone.
//
// PlanRebalance spreads replicas over the brokers that may hold them
// (alive, not leaving): a replica moves from the most loaded broker to
// the least loaded one that can take it, until no count is more than one
// above another. Only settled streams move (a leader, their factor of
// replicas, all alive, in sync and staying, no move under way), a
// follower's replica before a leader's. Every step lowers the spread, so
// planning ends.
//
// PlanReplacements is cluster.replace_after: a broker failed for that
// long, counted in the controller's memory from when it first saw the
// failure, is removed, so that its replicas move (a new controller, or a
// clock that jumps, only delays it).
//
// PlanLeaders is Kafka's preferred replica election: a stream's first
// replica not leaving is its preferred leader; once it has been alive,
// in the ISR and not leading for a while (counted by the caller), it is
// elected again, one stream per pass.
//
// # The watermark and the ISR (watermark.go, isr.go, quorum.go, truncate.go)
//
// A Tracker is a stream leader's view of its followers, fed every fetch
// (a follower fetching from offset o holds every record below o):
//
//  1. The high watermark is the lowest log end across the ISR; a member
//     that has not fetched counts as 0 (acks=all waits for it).
//  2. It moves only while the ISR has at least min_insync_replicas
//     members (MinInsync: the configured value, else 2 from 3 replicas
//     on, else 1); below it appends are refused (InSync).
//  3. Laggards are ISR members not caught up for replica_lag_max
//     (Kafka's lastCaughtUpTime: caught up when asking for the leader's
//     end, or for what the leader had at the previous fetch), or not
//     heard from (no fetch arrived, no long poll ended) for the session
//     timeout: a link cut between leader and follower alone, which
//     fences neither, holds acks=all no longer than a fenced broker.
//  4. Joiners are replicas outside the ISR at the watermark, with the
//     broker epoch they fetched in; from then on the watermark waits for
//     them too until the ISR takes them or the proposal fails (Kafka's
//     maximal ISR, KIP-497), so it never passes the log end of a replica
//     that may be elected.
//
// ProposeISR turns laggards and joiners into the AlterISR the leader
// submits: the ISR without the laggards, with the joiners that are alive
// replicas still in the broker epoch they caught up in. The controller
// applies it only under rule 3 of the state.
//
// Leader is whom a node takes for a stream's leader: itself only once
// the state registered its current incarnation (a restarted node's state
// may still name it leader of a stream that moved on since), else the
// leader the state names, followed by replicas and observers alike.
//
// MayCommit is a leader's fence: it moves its watermark only while the
// state names it leader in its epoch and it is InTouch with the
// controller (the controller, or heard from it within the heartbeat
// timeout, shorter than Serf takes to declare it failed), so a leader cut
// off from the site stops committing before it is deposed.
//
// TruncateTo is where a follower truncates before it fetches from a new
// leader (KIP-101/279): at the lower of the leader's end of the epoch it
// answered with and its own end of that epoch, so no record the leader
// lacks survives a change of leader.
//
// QuorumWithout checks that Raft keeps a quorum once a voter stops
// voting: the voters alive must stay a majority of those remaining.
package rules
