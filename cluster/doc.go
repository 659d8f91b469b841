// Package cluster holds a site's replication (DESIGN.md, "Cluster"). What
// exists so far: membership, the controller and the state it agrees on,
// commands submitted to the controller from any node, the replica fetch
// between a stream's leader and a follower, and the Replicator that runs
// them from the controller's state and keeps the ISR, and the Log that
// serves all of it to the MQTT front-end as an mqtt.Log, forwarding a
// follower's appends, state writes and claims to the leader, and the Site
// that `peat serve` runs with a `cluster:` section (edge/cluster.go).
//
// # Membership (membership.go)
//
// Every node runs Serf. Its tags carry the node's role (voter or broker),
// MQTT address, Raft address, Peat version and broker epoch. The broker
// epoch is new on every start (the stored one plus 1, at least the time in
// milliseconds, so a node whose disk was replaced still outranks its old
// incarnation): a restarted replica cannot rejoin an ISR on its old
// standing. One goroutine drains Serf's event channel (a blocked channel
// stalls Serf) and only nudges the controller loop.
//
// Failure detection is memberlist's: a probe every ProbeInterval, answered
// within ProbeTimeout, then a suspicion of SuspicionMult intervals that
// the other members' confirmations shorten to its minimum. The defaults,
// 500 ms, 250 ms and 3, leave a live node 1.5 s to refute a false
// suspicion; three nodes in one process on loopback (a node closed as a
// kill -9 closes its sockets) had a dead follower out of the controller's
// state in 2.25-2.40 s, and after the controller's death a new controller
// in 1.3-1.8 s with the old one out of the state in 2.3-2.5 s (3 rounds
// each, a loaded 2-core machine): a stream fails over well under 5 s. Serf's LAN defaults (1 s, 500 ms, 4) took
// 5.1-5.6 s here; 200 ms, 100 ms, 2 took 0.6-0.9 s but leave ~400 ms to
// refute (shared FACTS.md). On Wi-Fi, whose retransmits and power saving
// delay acks by hundreds of milliseconds, use Serf's defaults.
//
// # The controller (controller.go)
//
// Serf is only eventually consistent: it cannot keep two nodes from both
// acting as controller after a partition. The controller is therefore the
// hashicorp/raft leader among the voters (1, 3 or 5), the Consul pattern:
//
//   - Voters with no Raft state bootstrap once BootstrapExpect of them are
//     alive in Serf, all with the same configuration (the alive voters in
//     id order). A node added to a running site has BootstrapExpect 0.
//   - The leader runs leaderLoop: after a Barrier (every earlier entry
//     applied) it reconciles Serf's members with the Raft configuration
//     and the state, at once, on every member event and every
//     ReconcileInterval. An alive voter outside the configuration is added
//     as a voter, a broker as a non-voter (it follows the state without
//     voting); an alive member in a new epoch is registered; a failed or
//     departed one is reported failed, which takes it out of every ISR at
//     once; one that left gracefully or was reaped leaves the
//     configuration. A failed voter stays in it, as in Consul: removing it
//     would shrink the quorum on a guess; one removed for good (see
//     Moving replicas) leaves it.
//   - Raft's log and stable store are a RaftStore in the node's own Badger
//     database (logstore's key-value space: no second storage engine);
//     snapshots use raft's file snapshot store.
//
// Raft's timings default to raft's (1 s heartbeat and election timeouts,
// 500 ms lease; pre-vote on, as raft v1.7 has it).
//
// # The state (state.go, commands.go, fsm.go)
//
// FSM is the raft.FSM; State holds each broker's epoch and liveness, and
// each stream's replicas, leader, ISR, leader epoch and version. Commands
// (one kind byte, then msgpack) change it; a refused command changes
// nothing, on every node alike. The rules, Kafka's:
//
//   - A leader comes from the ISR only, alive, first in replica order;
//     with UncleanElection (per stream) and no such member, the first
//     alive replica, whose log then becomes the stream's.
//   - The ISR never becomes empty: its last member stays when it fails,
//     the stream goes offline (no leader), and comes back under that member
//     when it returns, losing nothing.
//   - AlterISR is a compare-and-set: refused unless the leader, its leader
//     epoch and the stream version are the current ones (a deposed leader
//     can never shrink the ISR), and every member is an alive replica in
//     the broker epoch named.
//   - A broker registering a higher epoch (a restart), or reported failed
//     in its current one, is fenced: out of every ISR it is not the last
//     member of, and its streams elect new leaders. A lower epoch, or a
//     failure report for another epoch, is stale and refused.
//   - LeaderEpoch grows with every change of leader; Version with every
//     change of leader, ISR or replicas.
//   - RemoveBroker marks a broker gone for good: refused while it is
//     alive, or while it is a stream's only ISR member (it alone holds
//     what was committed). A removed broker is never added to a replica
//     set and cannot register while a stream still names it; once none
//     does, it registers as a new, empty broker. The mark stays (a few
//     bytes) so that every controller keeps it out of Raft.
//   - DrainBroker marks a live broker draining (a decommission): never
//     added to a replica set again, kept across its restarts; refused
//     when a stream it holds could not have its replication factor on
//     the other alive brokers. KeepBroker ends a drain (`peat cluster
//     keep-node`): the moved replicas stay, a stream caught mid-move
//     drops its extra one; refused once the broker is removed.
//     SetReplicationFactor changes a stream's factor (at least 1); the
//     moves follow (reassign.go).
//   - MoveReplicas records replica moves (Stream.Moves, from -> to) of
//     streams with a leader and no move under way, from an alive
//     replica to an alive broker outside the replicas, neither leaving;
//     one bad move refuses them all. A move ends when its source leaves
//     the replicas, and is dropped at once when its source or target
//     fails, is removed or drains (every command ends with pruneMoves).
//
// Snapshots are the State as msgpack; fields added later (a stream's
// ReplicationFactor and Moves, a broker's Removed and Draining) decode
// as zero from older ones, and an older Peat ignores Moves. Command
// kinds are never renumbered: DrainBroker, SetReplicationFactor,
// KeepBroker and MoveReplicas have explicit ones (16, 17, 18, 19).
// A node of an older version cannot decode a kind newer than itself: a
// controller refuses it (ErrBadCommand: Site.Rebalance says to upgrade);
// a follower does not apply it, and its state lacks the moves (it
// applies the AssignReplicas that make them, old kinds; as controller
// it would leave them undone, or drop a target already added as an
// extra replica). Upgrade every node (a rolling restart) before using a
// new command: remove-node of a live node, keep-node, a changed
// replication_factor, rebalance.
//
// # Moving replicas (reassign.go, remove.go, rebalance.go, balance.go)
//
// A stream keeps the replicas it was created on until a broker is
// removed or drained, until its replica count differs from its
// ReplicationFactor (created on a site with fewer brokers, or the factor
// changed), or until a rebalance moves them (below). A broker is
// removed by an operator (Site.RemoveNode: `peat cluster remove-node`,
// POST /api/v1/cluster/nodes/<id>/remove) or, with Config.ReplaceAfter
// (cluster.replace_after, 0 = never), by the controller once it has
// seen it failed that long. The count is in the controller's memory,
// from when it first saw the failure: a new controller starts again, so
// a clock jump (a Pi without a clock battery) or a change of controller
// can only delay a replacement, never hasten it. A failed broker is
// never moved on a guess: a Pi rebooting, or a cable pulled for an hour,
// must not copy every stream again onto another node's flash.
//
// On every state change, member event and ReconcileInterval the
// controller runs planMoves (no I/O) and applies its AssignReplicas,
// Kafka's reassignment, add first and remove after:
//
//  1. a stream with fewer non-removed replicas than its factor gets new
//     ones on alive brokers outside its set, the least loaded first
//     (ties from a place the stream's name decides, as pickReplicas
//     spreads leaders); a new one takes a removed one's rank;
//  2. the new replica is already an observer fetching the stream (every
//     node is), or starts to; its leader takes it into the ISR once it
//     has caught up and acknowledged the consumer state (the
//     Replicator's rules: proposeISR counts replicas only, so it joins
//     only once the state names it);
//  3. once every alive replica it keeps is in the ISR, the removed one
//     leaves the replica set. A removed broker is dead and out of every
//     ISR, so the ISR never shrinks; with no broker to move to, it
//     leaves anyway and the stream shows under-replicated until one
//     joins.
//
// Each pass also takes a removed member out of Raft's configuration (a
// 3-voter site then has 2 voters until a new voter joins) and out of
// Serf (force-leave, pruned: no more probes or reconnects). A leader's
// min_insync_replicas default follows its replica count as it changes.
//
// A live node is decommissioned by the same command: RemoveNode of a
// member Serf sees alive submits DrainBroker instead. The node keeps
// serving; planMoves treats it as leaving (steps 1-2 above), and drops
// it from a stream only once the stream has its factor on kept
// replicas that are all alive and in the ISR (never an under-replicated
// moment: with a broker gone meanwhile it waits). When it leads, the
// same AssignReplicas elects the first kept ISR member, the controlled
// leader change a hand-over makes; except on acks: leader streams
// (Config.AcksLeader, which StartSite sets), whose leader may have
// answered records no follower has: the controller holds that step
// (planMovesHolding) and the leader, seeing in the state that its
// replica is to go (its Site.manage runs Log.leaveLeads, which asks
// planMoves), drains the stream as leader balancing does below and
// elects the first kept, alive ISR member; the next pass drops it. A
// leader that fails (followers not caught up in 2 s, the election not
// made) takes appends again and tries after 2 s; after handOffLimit
// (30 s, counted in the controller's memory) the controller moves it at
// once as before and logs a warning: a decommission never hangs on a
// follower that cannot keep up, or on a leader running an older Peat
// (which never hands over; an older controller never holds). Once it holds no replica the
// controller demotes a draining voter to non-voter (it follows the
// state, so its clients' publishes are still forwarded right) if the
// voters left alive stay a majority of those remaining; a draining
// controller first hands Raft's leadership over. RemoveNode refuses up front (ErrQuorum) a voter without which
// fewer than a majority of the remaining voters are alive, the only
// voter included. Status shows the member "draining" (with the streams
// it still holds), then "drained": the operator stops it, Serf reports
// it failed, and the controller submits RemoveBroker and forgets it as
// above.
//
// A stream's factor comes from the configuration (replication_factor,
// the stream's or the site's; 0 leaves it). Site.manage submits
// SetReplicationFactor once per run for each stream whose factor in the
// state differs, once this node's registration in its broker epoch is
// applied (its state is then recent): the node started last wins.
// "The controller's configuration wins" would flap in a rolling restart
// that changes it, as the controller moves between nodes with the old
// and the new value, copying a stream and dropping it again. Raised,
// planMoves adds replicas on the least loaded brokers, which catch up
// and join the ISR; lowered, it drops the extra ones: never the leader,
// the dead first, then those outside the ISR, then the last in replica
// order, so the ISR keeps every member it can. edge refuses a
// min_insync_replicas above the factor (every publish would be refused).
//
// Rebalancing (rebalance.go; Kafka's kafka-reassign-partitions, which
// Cruise Control automates): a site grown from 3 to 5 nodes keeps every
// stream on the first three, whose disks fill while the new ones hold
// nothing. Site.Rebalance (`peat cluster rebalance`, POST
// /api/v1/cluster/rebalance) runs planRebalance (no I/O) on its node's
// state: among the brokers that may hold replicas (alive, not leaving),
// it moves a replica from the most loaded to the least loaded, ties in
// id order, until no count is more than one above another. Only settled
// streams move (a leader, their factor of replicas, all alive, in the
// ISR and staying, no move under way), a follower's replica before a
// leader's. The
// counts take the moves under way as done. It submits the plan as one
// MoveReplicas; a controller whose state moved on refuses it (run it
// again). planMoves then treats each move's source as a draining
// broker's replica: the target is added in its place (steps 1-2),
// and the source leaves once the stream has its factor on kept replicas
// all in the ISR, its leadership, if any, going in the same
// AssignReplicas to the next kept ISR member in replica order: the
// target, which takes its rank (leader balancing then makes it the
// preferred leader too); an acks: leader stream's leader hands over
// itself first, as a draining one does. A stream is never less replicated or less in
// sync than before. Status shows each stream's moves (Moving) until
// they end.
//
// Leader balancing (balance.go, Kafka's preferred replica election): a
// stream's first replica not leaving is its preferred leader. After a
// failover, a node that returns is a follower of every stream it led;
// on the controller, Site.manage elects it again (ElectLeader with
// Preferred) once it has been alive, in the ISR and not leading for
// Config.LeaderBalanceAfter (cluster.leader_balance_after, 5 min, 0:
// never), counted in the controller's memory (a new controller counts
// again), one stream per pass. The change is the controlled one: the old
// leader stops committing once its state names another, and the new
// one, an ISR member, holds everything acknowledged under acks=all;
// appends in flight on the old leader are refused (clients resend).
// The controller leaves streams with acks: leader alone: their leader
// may have acknowledged records no follower has yet. Their leader moves
// them itself (Site.handOff), on the same rule counted in its own
// memory: it drains the stream as a hand-over does (appends and state
// writes refused, every ISR member caught up, 2 s at most), then submits
// the ElectLeader; if the followers did not catch up, or the election
// was not made and its state still names it, it takes appends again.
//
// # Raft's keys in the key-value space (raftstore.go)
//
//	log entry     'l' <index:8 BE>   -> version 1 | term uvarint | type byte
//	                                    | appended-at unix ns varint (0: zero time)
//	                                    | data length uvarint | data
//	                                    | extensions length uvarint | extensions
//	stable key    's' <key>          -> value (uint64s: 8 bytes BE)
//	broker epoch  'e'                -> uint64 BE, the last one used
//
// Big-endian indexes keep Badger's key order the log's order. The first
// and last index are kept in memory and read back with a seek
// (logstore.KVScanRange). StoreLogs writes one transaction when the
// entries fit in one, else splits the batch, lowest indexes first;
// DeleteRange deletes a prefix from its low end and a suffix from its
// high end, 1024 keys a transaction, so a crash part way leaves a
// contiguous log.
//
// # Replica fetch (replica_leader.go, replica_fetcher.go, replica_server.go, hw.go)
//
// Kafka's rules, on logstore's replica seams (its store runs with
// ManualCommit). A Server answers, one goroutine per connection, for the
// streams this node leads; each has a Leader, created with the
// controller's leader epoch and ISR. A Fetcher on a follower:
//
//  1. asks the leader where the leader's log of its own latest epoch ends
//     (an EpochRequest) and truncates there, at the lower of that and its
//     own end of the epoch answered (KIP-101/279), so no record the leader
//     lacks survives a leader change;
//  2. fetches "everything after my offset" (its log end), with the leader
//     epoch it believes in (older: FencedLeaderEpoch, it stops; newer:
//     the leader has not heard yet, it retries) and the watermark it last
//     heard; appends the leader's record values unchanged (AppendReplica
//     checks each checksum against its offset) and moves its watermark to
//     the leader's, capped at its own log end;
//  3. below the leader's log start it starts over there (ResetTo); above
//     its log end it truncates as in 1.
//
// The leader answers at once when it has records past the offset or a
// watermark above the one the follower heard, else holds the fetch up to
// MaxWait (the long poll: followers learn new records and the watermark
// without polling). Each fetch tells the leader the follower's log end;
// hwTracker (no I/O) keeps them: the high watermark is the lowest log end
// across the ISR (a member that has not fetched counts as 0: acks=all
// waits for it), Laggards are ISR members not caught up for replica_lag_max
// (Kafka's lastCaughtUpTime: caught up when asking for the leader's end, or
// for what the leader had at the previous fetch), Joiners are replicas
// outside the ISR at the watermark, with the broker epoch they fetched in;
// from then on the watermark waits for them too, until the ISR takes them
// or the proposal fails (Kafka's maximal ISR, KIP-497: otherwise it could
// pass a joiner's log end while AlterISR is on its way, and a member
// missing committed records could then be elected).
//
// An acks=all acknowledgement waits for the slowest ISR member's fsync.
// Two things keep that to about one fsync rather than four in a row: the
// leader serves a group commit while it is still writing it (logstore's
// early shipping: the follower appends and fsyncs beside the leader; the
// watermark still counts only the leader's durable end, and a fetch's
// offset may be up to ShipEnd), and a watermark move is published without
// a write of its own on leader and follower alike (logstore persists it
// lazily). BenchmarkLog_AcksAll (three nodes in one process, one disk)
// measures it: one acknowledgement alone took 5.3-7.5 ms before and
// 2.1-3.2 ms after, on a machine loaded by other work (load 6-14).
//
// The protocol (cluster/wire) is length-prefixed frames of msgpack arrays
// with typed error codes; its doc draws them. Fetchers take a Dialer, so
// tests run replication over cluster/faultnet, an in-process network that
// delays, cuts, partitions and drops links (tc netem is not available on
// the machines here).
//
// # Commands from any node (submit.go)
//
// Node.Submit has a command committed wherever the controller runs: applied
// locally on the controller, else sent as a CommandRequest frame (cluster/
// wire) to the Server of the node Raft names leader, at the cluster
// address its Serf tags advertise. The receiver applies it only if it is
// the controller in at least the submitter's Raft term (a deposed
// controller answers NotController, naming the one it knows) and the
// submitter's broker epoch is not older than the state's. NotController,
// no known controller and lost connections are retried with backoff until
// the context ends; the state machine's refusal comes back as the same
// typed error (ErrStaleVersion, ...), by an index into a table.
//
// # The Replicator (replicator.go, isr.go)
//
// One goroutine per node watches the state (the FSM every node applies):
// for each stream it holds a replica of, it runs a Leader (NewLeader sets
// the stream's leader epoch in logstore before any append) while the
// state names it leader, else a Fetcher from the leader the state names,
// which truncates to that leader's epoch end first. A change of leader or
// leader epoch stops the role and starts the new one; an ISR change the
// controller committed is handed to the Leader (SetISR), never earlier:
// the watermark never moves on a smaller ISR before the controller agreed.
// Every quarter of LagMax (replica_lag_max) a leader proposes AlterISR
// through Submit, dropping followers not caught up for LagMax and adding
// those caught up in their current broker epoch; the compare-and-set on
// leader epoch and version refuses a deposed leader's proposals. After
// every pass it publishes the Leaders it runs (Leading), which the Log's
// appends ask. A node leads only once its state has registered its
// current broker epoch: a restarted node's state, restored from a
// snapshot, may name it the sole ISR member of a stream that moved on
// since, and the registration comes after all that (and fences the old
// incarnation's leaderships).
//
// A leader commits (moves its watermark) only while:
//
//   - its ISR has at least MinInsyncReplicas members (a leader alone in
//     its ISR commits nothing when the minimum is 2);
//   - this node's copy of the state still names it leader in its epoch;
//   - this node is the controller, or heard from it within the Raft
//     heartbeat timeout (1 s). The controller deposes a leader only after
//     an election it commits, for a failure Serf needs at least 1.5 s to
//     declare (the defaults); a leader cut off from it has stopped
//     committing by then. An asymmetric partition where Serf declares a
//     node failed while its Raft still hears the controller is not
//     covered by this argument.
//
// Tests run Raft too over faultnet (Config.RaftListener) to partition a
// leader from the site: it never commits what it takes while cut off, a
// new leader from the ISR takes over, and after healing the old leader
// truncates to the new leader's epoch end and every replica holds the same
// committed records.
//
// # The Log (log.go, log_stream.go)
//
// Log is mqtt.Log on one node. Its streams are those of the node's store
// that the controller's state holds; one goroutine follows both (a stream
// created through the controller, added to or removed from the store
// comes or goes at run time, with mqtt's StreamEvents). A node outside a
// stream's replicas is an observer of it: its Replicator runs a Fetcher
// as on a follower, so its clients read the stream there and its
// producers are forwarded, but the leader never counts it (proposeISR
// takes replicas only, and the watermark is the ISR's). Filters, and so routing,
// come from the store's stream configuration: the state names replicas,
// not topics.
//
// # The produce path (log_stream.go, forward.go, forward_server.go)
//
// A producer may use any node that holds a replica of the stream. On the
// stream's leader (where the Replicator runs its Leader) an append is
// taken only while the ISR has min_insync_replicas members, else refused
// with mqtt.ErrNotEnoughReplicas (MQTT reason 0x97); it is written
// locally (the store runs with ManualCommit, so that only means written),
// and its done is called, in call order, by the stream's goroutine once
// the high watermark has passed it, that is once the ISR holds it. If
// leadership moves first it is refused with ErrLeaderUnavailable (0x80,
// "stream leader unavailable"), if the ISR falls below the minimum with
// ErrNotEnoughReplicas; the records may still commit under the next
// leader, so a producer's retry can duplicate them (at least once). A
// Leader admits appends until Close (or a hand-over's Drain) begins and
// Close waits until those are written: no record of an ended leadership
// lands after the Fetcher that follows it truncated the log.
//
// On a follower, AppendAsync forwards: the records (forward_codec.go: the
// producer's fields; a zero timestamp is stamped here, with this node's
// clock) go to the leader the state names, at its Serf-advertised
// cluster address, dialled with the Node's dialer (cluster TLS applies),
// as ProduceRequest frames on one connection per stream and leader epoch.
// The connection is a pipeline: a writer sends each append as soon as it
// is made while at most fwdWindow (256) are unanswered, the leader's
// Server reads them without waiting, hands each to its stream's local
// append in arrival order (so call order on this node is append order on
// the leader), and writes the answers in the same order, each naming its
// sequence number. The leader answers as it would answer its own
// producer; the follower calls done with the leader's first offset once
// its own watermark has passed the records too (so a reader on this node
// sees what was acknowledged here; after fwdLocalWait, 10 s, a replica
// that stopped fetching answers anyway). Refusals come back typed:
// NotEnoughReplicas as mqtt.ErrNotEnoughReplicas, RecordTooLarge and
// NoSpace as logstore's ErrRecordTooLarge and ErrNoSpace (so MQTT gives
// the reason codes a single node gives), NotLeader and stale epochs as
// ErrLeaderUnavailable. When the connection fails, an answer is missing
// for fwdTimeout (30 s), or the state names another leader or epoch,
// every append unanswered is refused with ErrLeaderUnavailable: the old
// leader may still commit some (at least once), but done(nil) is only
// ever called on the leader's word that the records are committed, so an
// acknowledged record is in the ISR and survives on whichever replica
// the controller elects. A node holding no replica of the stream does not
// show it (observers are not done).
//
// # acks=leader
//
// LogConfig.AcksLeader names the streams that are acks=leader: their
// leader answers an append, its own or forwarded, once written locally
// (not waiting for the ISR), min_insync_replicas does not refuse it, and
// a forwarding follower answers on the leader's word without waiting for
// its own watermark. Such an answer is given before the records are
// committed: a leader that dies can lose them, and Committed may still be
// below them when done runs. Consumer-state writes of such a stream are
// answered once the leader wrote them, too. A graceful stop of the
// leader loses neither: it drains first (see "A node of a site").
//
// Reads, Committed and Changed serve the committed records of this node's
// replica, on every replica; Changed is forwarded from the store's (the
// forwarder takes the store's next channel before it tells, so no
// advance is missed).
//
// # Consumer state (state_repl.go)
//
// Group offsets and session positions (Stream.WriteState) are the
// stream's, and follow Kafka's __consumer_offsets: written by the leader,
// replicated to the ISR, answered once the ISR holds them.
//
//   - On the leader, WriteState writes its store and gives the write the
//     next version (leader epoch, seq); its latest writes, up to
//     stateLogMax (4096) keys, are kept in memory as changes.
//   - On a follower, WriteState is forwarded to the leader (a
//     StateWriteRequest) and answered with the leader's answer.
//   - Every follower runs one more long poll per stream, a
//     StateFetchRequest naming the version it holds: the leader counts it
//     as that follower's acknowledgement, and answers with the changes
//     since (merged), with its whole state (Reset) when the version is of
//     another leader epoch or older than the kept changes, or, when there
//     is nothing new, after up to 500 ms. The follower writes the answer
//     into its store (a Reset also deletes the keys the leader lacks) and
//     asks again.
//   - The leader answers a write once every other ISR member has
//     acknowledged its seq (about one round trip), or refuses it:
//     ErrNotEnoughReplicas below min_insync_replicas or when the ISR has
//     not acknowledged it within 15 s, ErrLeaderUnavailable if leadership
//     moves meanwhile. mqtt's state writer retries failed writes.
//
// A new leader comes from the ISR, so it holds every state write that was
// answered, and a group offset never points past its log: consumers are
// given committed records only, which every ISR member holds. StateMoved
// fires when this node becomes the leader, and mqtt loads the state again
// (it does not fire on followers as they apply the leader's changes:
// their consumers write through the leader and keep their own positions).
// A replica outside the ISR is taken back (Leader.Joiners) only once it
// has acknowledged the leader's latest state version as well as caught
// up with its records, so whoever the controller can elect holds every
// answered write. What a failover can lose: writes not yet answered
// (consumers then re-read from the previous position: at least once),
// and with acks=leader what the dead leader had answered. A follower
// restarting, or meeting a new leader, gets the
// whole state again; a Reset larger than logstore.MaxStateWrite entries
// is written in several steps, so a crash part way leaves a mix of the
// old and the new state on that follower until its next fetch.
//
// Log.State is this node's store's, not replicated; durable sessions
// are the site's (see "Sessions across the site").
//
// # Claims (log_claims.go)
//
// A group's single consumer is decided by the stream's leader for every
// node, and kept as the group coordinator of Kafka keeps its groups: in
// the stream's replicated state (Kafka's __consumer_offsets holds group
// metadata beside the offsets), so the coordinator's successor, which
// comes from the ISR, knows every group's member without asking anyone.
//
//   - A follower's Claim and Unclaim are forwarded (ClaimRequest); a
//     leader that cannot be reached grants nothing and names no holder.
//   - The leader decides one claim at a time from the claim its state
//     holds under "\x00c/<key>" (hidden from mqtt's LoadState, refused in
//     its WriteState): version 1 | broker epoch 8 BE | node length uvarint
//     | node | holder. A claim is a state write answered once every ISR
//     member holds it, under acks=leader too (the one-consumer rule is
//     worth a round trip; only acks=all refuses below
//     min_insync_replicas). So a claim waits, as an acks=all publish
//     does, while a dead follower is still in the ISR. A claim the ISR
//     did not acknowledge is refused and taken back on the leader.
//   - A claim names the client, its node and that node's broker epoch;
//     the leader treats it as free once the controller's state has that
//     node failed or in another epoch. That is the lease: Kafka's
//     coordinator expires a member that stops heartbeating, and here the
//     node's liveness, which Serf and the controller already track and
//     fence, stands for its clients (their connections end with it). A
//     per-claim lease would add a write per renewal to an SD card and
//     one more timeout to tune, for nothing Serf does not already see.
//     A release names the node too, so a late release from a client's old
//     connection does not free the claim it made since on another node.
//   - A release that cannot reach the leader is kept and sent again
//     (200 ms backoff up to 2 s) until a leader has it; a Claim of the
//     same key from the same node sends it first. Every 5 s each node
//     also looks in its replica's state for claims naming its clients in
//     its epoch that it did not grant, or let go (a claim written but
//     whose answer was lost, a release lost with a leader), and releases
//     them (repairClaims). Claims of gone nodes stay in the state until
//     the key is claimed again: at most one per group and stream. (The
//     sessions' claims are adopted instead: "Sessions across the site".)
//
// There is no re-assertion to a new leader: it held every answered claim
// already. An unclean election (a leader from outside the ISR) can lose
// claims as it loses records. Claims hold while a partition separates a
// holder from the leader but not from the controller: the holder's node
// is alive, so its client keeps the group, as Kafka's member keeps its
// partitions until its session times out.
//
// # Sessions across the site (log_sessions.go)
//
// A durable session is the site's: a client whose node died reconnects
// to any other and finds it. Its offsets are stream state, replicated
// with each stream; its properties and subscriptions are in the state of
// one more stream, SessionsStream ("_sessions"), which every node's Site
// creates with the configured ones, at the largest of their replication
// factors (nodes outside its replicas are observers, which fetch its
// state too; Status lists it last). It captures no topics: a mirror
// stream without filters in the store, which nothing routes to and which
// holds no records. The controller's
// state was not the place: Kafka keeps groups in __consumer_offsets, not
// in its metadata quorum, because the Raft log is applied by every node,
// snapshotted whole and on the path of every election, and per-client
// churn (every connect, subscribe and disconnect of a persistent client,
// thousands after a site's power cut) would slow down the decisions a
// failover waits for. The stream gets from what exists writes answered
// once its ISR holds them, a failover that keeps them, a copy on every
// node to read at connect, and claims.
//
// The Log keeps the stream out of Streams, Stream, Route and
// WatchStreams, and serves it to mqtt as mqtt.SiteSessions:
//
//   - SessionState is its state: writes through its leader, fenced there
//     by the sessions' claims (below), loads from this node's replica.
//   - ClaimSession claims the client id with the id itself as holder, so
//     the leader grants it whoever held it, naming this node: MQTT's one
//     connection per client id becomes the claim's move. The node that
//     held it sees its replica's claim name another node, or go
//     (claimsMoved, on the leader as it decides and on a follower as it
//     applies fetched changes) and calls OnSessionTaken: mqtt there
//     closes the old connection and drops its later writes of the
//     session. An ISR member applies the move before the new claim is
//     answered (its acknowledgement is its next fetch); an observer a
//     fetch later. A site still forming, or whose sessions' leader is
//     failing over, is waited for up to 10 s (sessionClaimWait), trying
//     every 250 ms.
//   - ReleaseSession goes through the claims' retried releases
//     (repairClaims), without waiting.
//
// mqtt reads a session when its client connects (mqtt's sessions_site.go
// says how), not at start; the node holding the claim alone writes it.
// What a node's death can cost: up to mqtt's state interval (100 ms) of
// acknowledged progress, delivered again, and a subscription made in the
// same instant is held by the SUBACK until the site has it.
//
// Writes are fenced on the leader as well as on the writing node
// (writeStateFrom): a write of the sessions' state names its node and
// broker epoch (StateWriteRequest's optional fields), and the leader,
// under claimDec, the lock claims are decided with, refuses it as a
// whole (NotHolder, naming the keys) when a session it touches is
// claimed by another node, by the writer's node in another epoch, or by
// no one. A session is claimed before its first write and released only
// once its deletion is written, so a write finding no claim is late too:
// the session was adopted and expired meanwhile (or its claim was lost,
// and its client claims it again at its next connect). Writes of the
// leader's own node are checked alike. The writing node drops those keys
// and writes the rest at once (sessionState.WriteState), as mqtt drops
// its own writes of a session it knows moved, and lets the session go
// once its replica shows the claim moved or deleted. So a write the old
// holder sent or queued before it applied the move never lands after
// it. The check reads each session's claim; claimDec is let go once the
// write is in the leader's store, so writes wait for a claim being
// decided (its ISR round trip) but not for each other's acknowledgement.
//
// A session's offsets are in its streams' own state, whose leaders
// decide no claims; each fences them from its replica of the sessions'
// stream instead (unheld): a write of a stream's state names its
// node as well, and its leader refuses the keys of session offsets
// (mqtt.SessionOffsetClient) whose claim there does not name the writer,
// as above. Only a member of the sessions' ISR checks: the sessions'
// leader answers a claim once its ISR has applied it, so such a replica
// shows every claim a writer can hold, and a late write of the old holder
// either finds the move or landed before the new holder was answered (as
// if sent a moment earlier). An observer of the sessions' stream (a site
// of more than three nodes) leading a stream writes offsets unfenced, as
// all did before. Group offsets are no session's and are not fenced.
// A node's own sessions from before it joined a site are none of the
// site's, so the offsets of theirs that its start moves into streams
// (mqtt's migrateState) are dropped the same way.
// TestLog_SessionOffsetsFencedOnStreamLeader and
// TestSite_DeleteStreamForgetsLayout3Positions show it.
//
// In a site of mixed versions, a 4-field StateWriteRequest (an older
// node's) names no node and is written unfenced, as before; a node names
// itself only to a leader whose Serf tags show its own Peat version,
// since an older leader drops the longer frame (and every session write
// with it until the upgrade ends). Writes then go unfenced, as they did,
// and an older node's late write of an expired session is adopted again
// (below).
//
// Expiry is run by the node holding a session's claim (its mochi
// expires the disconnected client), or by the node its client connects
// to next. A node that dies, leaves or restarts (it reads sessions at
// connect, not at start) leaves its sessions to no one, so the leader of
// SessionsStream adopts them (log_orphans.go): at every change of the
// controller's state or of its leadership, and every 5 s, it looks in
// its replica for claims whose node the state has failed or in another
// broker epoch (the claims' lease above) and offers their client ids to
// mqtt on its node (OnSessionsOrphaned). mqtt adopts each one
// (AdoptSession: a claim decided on the leader under claimDec, granted
// only while the holder is still gone, so a client claiming meanwhile
// keeps it), reads it, counts one stored while connected as
// disconnected from the adoption (and writes that time, so a next
// adopter keeps the clock), and deletes it site-wide once its expiry
// runs out, by mochi's rule; its client claims it back from the adopter
// like from any node (mqtt's sessions_orphans.go). A node seen failed
// wrongly (a partition) that comes back in its epoch finds the claims
// moved and closes its connections of those clients, as after any
// take-over: the site decided they were gone. An adopter that dies in
// turn is a gone holder like any other. A stored session that no claim
// holds (a late write of an older node, which is not fenced; claims lost
// with the stream's data, SessionsStream having no unclean election) is
// offered too, and adopted once AdoptSession, under claimDec, finds it
// still stored and unclaimed: its expiry runs. A client connected to a
// node whose claim was lost then loses its connection (the move, as for
// a fenced write), and claims the session back when it reconnects.
// TestLog_OrphanedSessionAdopted, TestLog_UnclaimedSessionAdopted,
// TestLog_SessionWriteFencedOnLeader,
// TestLog_AdoptedSessionNotBroughtBack, edge's TestCluster_Orphaned* and
// TestCluster_RestartedNodesSessionExpires, and sitetest's
// TestSite_OrphanedSessionExpires (kill -9) show it.
//
// The streams' state is shared (mqtt.SharedState), so mqtt never takes
// another node's session offsets for leftovers
// (TestCluster_SessionOffsetsSurviveOtherNodes). edge's
// TestCluster_SessionResumesOnAnotherNode,
// TestCluster_SessionTakenOverAcrossNodes and
// TestCluster_CleanStartEndsTheSessionSiteWide, sitetest's
// TestSite_DurableSessionKill (kill -9) and TestLog_SessionTakenOver
// show it.
//
// TestLog_Contract runs mqtt's contract suite against the Log of a
// one-node site; all of it passes (streams are added through the
// controller and the store, removed through the store; a stream deleted
// through the controller goes as described in "Deleting a stream"). TestLog_ThreeNodes and
// TestLog_MinInsyncReplicas check the produce and read paths on three
// nodes; TestLog_ForwardAppend, TestLog_ForwardLeaderKilled,
// TestLog_AcksLeader, TestLog_StateFailover, TestLog_ClaimAcrossNodes,
// TestLog_ClaimHeldAcrossAFailover, TestLog_UnclaimWhileLeaderUnreachable,
// TestLog_ClaimOfDeadLeadersClient and TestLog_ClaimRepair the
// forwarding, acks=leader, state and claims.
//
// # Mirror streams in a site (log_mirror.go)
//
// A mirror stream (edge/mirror: another Peat's stream at its source's
// offsets) is replicated like any stream: created from the
// configuration, a leader, an ISR, min_insync_replicas. Its records
// cannot be appended as a publish is, since the leader would give them
// its own offsets; Log.Mirror takes them with their source offsets
// instead, and a stream that is a mirror refuses AppendAsync (mqtt
// routes no publish to it anyway):
//
//   - On the leader, the stream's mirrorWriter (started on first use)
//     takes what has queued, in call order, and runs LogConfig.Mirror
//     (edge/mirror.Apply: the rules against the leader's log end,
//     written with AppendReplica at that end, stamped with the leader
//     epoch) once for the lot; each call then waits, as an acks=all
//     append does, for the watermark to pass the highest offset it
//     appended or found already there (a duplicate not yet committed
//     waits too). The writer is admitted by the Leader like an append
//     (beginAppend), so Close waits for it and no record of an old epoch
//     lands after a truncation.
//   - On a follower, the records go down the produce pipeline with their
//     source offsets and starts (the wire's sixth ProduceRequest field),
//     and the answer carries one result per record; the call is answered
//     once this replica's watermark has passed them too.
//   - A call refused as a whole (no leader, leadership moved before the
//     records committed, the ISR too small, the forwarder's connection
//     lost) refuses every record: the sender (edge/sink/peatsink) sends
//     again from its position. A new leader may have truncated what the
//     old one had not committed, or hold it: the resends are appended or
//     acknowledged as duplicates, and a record beyond its end is refused
//     until the missing ones come. No offset holds two records, and each
//     sits at its source offset, on every replica.
//
// edge refuses acks: leader and unclean_leader_election on a mirror: a
// record acknowledged and then lost would leave a hole that the sender,
// already past it, never fills, and the mirror would refuse every later
// record. edge's TestCluster_MirrorThroughAFollower,
// TestCluster_MirrorLeaderKilledMidStream and
// TestCluster_MirrorDuplicatesAndGaps show it in process, and sitetest's
// TestSite_MirrorLeaderKill with real processes and kill -9.
//
// # A node of a site (site.go)
//
// StartSite is what `peat serve` runs with a `cluster:` section: the Node,
// a Server on the transport address, the Replicator and the Log over the
// node's store (ManualCommit). Every node has the controller create the
// streams of its configuration once ReplicationFactor brokers are alive
// (default: the voters, at most 3), on replicas picked from the sorted
// alive brokers from a place the stream's name decides, so that leaders
// spread; nodes race harmlessly (a second creation with other replicas
// is refused with ErrStreamExists). A site with fewer brokers creates it
// on those it has once every alive member has been registered for
// siteSettle (5 s; a forming site registers members one by one), with
// its ReplicationFactor in the state, and the controller adds replicas
// as brokers join. min_insync_replicas defaults per stream: 2 from 3
// replicas on, else 1.
//
// While it sees no other alive member it joins its Join addresses again
// every 2 s (Consul's retry_join): a node restarted while the others were
// down finds them when they are back. Serf's snapshot file keeps the
// members it knew as well, but is written only as events arrive, so a
// kill -9 may lose its last lines.
//
// Close is a controlled shutdown (HandOver): the node reports itself
// failed in its own broker epoch through the controller, which fences it
// at once (out of every ISR, new leaders for its streams), and a
// controller hands Raft's leadership to another voter; then everything
// closes. Without it the streams it led would wait for Serf's failure
// detection before taking publishes again, and acks=all would wait for a
// follower that has gone.
//
// An acks: leader stream's leader has answered records and state writes
// its followers may not hold yet, and BrokerFailed elects at once. So
// first, on each such stream it leads with another ISR member (all at
// once), it drains (Leader.Drain, Log.drainAcksLeader): it refuses
// appends and state writes with ErrLeaderUnavailable, as while a leader
// moves (clients resend to the next), waits for those admitted, then
// until every ISR member, and every joiner the watermark counts, has
// fetched to its log end and acknowledged its state writes. Waiting for
// all, not one, leaves the election as it is: it takes the first ISR
// member in replica order, and each then holds everything answered. A
// follower that stopped fetching stays in the ISR for replica_lag_max
// and must not hold the stop: the drain gets 2 s of the hand-over's 5 s;
// then the leader shrinks the ISR (AlterISR) to the followers at its log
// end, if some are, so that one of them is elected. With none, it hands
// over as before, and what it alone held is lost (logged). A follower
// fetches while the leader waits: the Server and the Replicator close
// after HandOver. A crash still loses what acks=leader answered.
//
// # Security (keyring.go, tls.go)
//
// Gossip is encrypted when Config.KeyringFile names Serf's keyring: a
// JSON list of base64 AES keys (16, 24 or 32 bytes), the first primary,
// the file Serf and Consul write. Memberlist encrypts with the primary
// key and accepts any key of the ring; clear-text gossip is refused
// (GossipVerifyIncoming). A node with another key, or none, never
// appears in the site's member list. Node.InstallKey, UseKey and
// RemoveKey change every member's ring live through Serf's KeyManager (a
// query every member answers; the error names those that failed or did
// not answer, and the operations are idempotent, so repeat them), and
// each member rewrites its KeyringFile (Serf's KeyringFile option), so a
// restart keeps the rotated keys. A rotation: install the new key, use
// it, remove the old one; a member down during it needs the new key in
// its file before it can rejoin.
//
// Config.TLS puts Raft's transport and the cluster transport (Submit,
// replica fetch: every Dial goes through Node's dialer, every Server
// listener through Node.ClusterListener) under TLS 1.3 with client
// certificates. Both sides check the peer's chain against the site's CA
// file only; host names are not checked (nodes are dialled by LAN IP,
// which their certificates need not name). Raft runs on a
// raft.StreamLayer over a TLS listener and dialer. With VerifyNodeID a
// dialled node's certificate must also name (DNS name or common name)
// the member advertising that address, and a connecting peer's must
// name some member: a site certificate issued to an MQTT client opens
// nothing, and a node cannot answer for another's address. (A connecting
// peer is not tied to one member: source addresses prove nothing.) A
// foreign certificate
// fails the handshake: Raft never reaches the node, its fetches and
// submits are refused, and the Server logs the refusal with the peer's
// address. An unreadable or invalid keyring, CA, certificate or key, or
// a certificate the CA did not sign, fails Open with an error naming the
// field: a node never falls back to the clear.
//
// # The operator's view (status.go, metrics.go, leader_status.go)
//
// Site.Status is one node's view, made on request: its id, broker epoch,
// role, the controller it knows and Raft's voters and non-voters; Serf's
// members with their state and tags; per stream the controller's state
// (leader, leader epoch, version, replicas, ISR, under-replicated when the
// ISR is smaller than the replicas), this node's replica's high
// watermark and log end, and, on the node leading it, each replica's log
// end and lag in records as the Leader last heard them (Leader.Positions,
// under the Leader's lock; a replica that has not fetched from this
// leader counts as 0, as the watermark counts it). GET /api/v1/cluster
// serves it.
//
// CaughtUp (/readyz) is false while no controller is known, while the
// controller has not registered this run's broker epoch (a restarted node
// whose state still shows its old standing), or while the node is a
// replica of a stream outside its ISR; the reason names which.
//
// Collector reads Status at scrape time, so a series goes with its
// stream or replica and nothing is counted twice:
// peat_cluster_members{state}, peat_cluster_is_controller,
// peat_cluster_caught_up, peat_stream_isr_size, peat_stream_replicas,
// peat_stream_under_replicated, peat_replica_lag_records{stream,replica}
// (on the leader only), peat_cluster_leader_elections_total{stream} (the
// stream's leader epoch: every change of leader since its creation, as
// the agreed state counts them, the same on every node and across
// restarts) and peat_cluster_controller_changes_total. The last is this
// node's own count: StartSite registers a raft observer of leader
// changes and counts each new (controller, Raft term), so a follower
// that loses the leader for a heartbeat and hears it again in the same
// term counts nothing; it starts at the first controller this run knows.
//
// # Deleting a stream (delete.go)
//
// A stream left out of a node's configuration stays in the state and on
// every disk: a line missing (a typo) must never delete a site's data.
// Site.DeleteStream (`peat stream delete`, DELETE /api/v1/streams/<name>)
// deletes it:
//
//   - Each node tells the controller which streams its configuration
//     lists (ListStreams, once the controller registered its broker
//     epoch, and again when the list differs; Broker.Lists). DeleteStream
//     is refused (ErrStreamListed, naming the nodes) while a broker not
//     removed lists the stream, down or not: createStreams on that node
//     would create it again at once, or when it is back. The operator
//     removes it from every node's streams: and restarts them (a rolling
//     restart), then deletes; a node gone for good is removed first
//     (remove-node). edge refuses too while the node asked lists it.
//   - Every creation gets an incarnation, State.Incarnations counting
//     (Stream.Created; 0 for streams created before deletions existed).
//     DeleteStream names the incarnation it deletes, so a request that
//     raced a re-creation deletes nothing; the state keeps a tombstone,
//     Deleted[name] = that incarnation (a few bytes per name, for good:
//     a node away for months still learns of it).
//   - Each replica records in its store which incarnation its records
//     belong to (logstore's SetIncarnation). A stream with none is
//     adopted (stamped) unless a tombstone names it; one stamped with
//     another incarnation, or unstamped under a tombstone, holds a
//     deleted stream's records: neither the Replicator (currentReplica)
//     nor the Log (refresh) serves it, so it can neither lead with the
//     old records nor show them to a subscriber.
//   - followDeletions, at start and at every state change, deletes
//     the stored copy of a tombstoned stream the configuration no longer
//     lists (logstore DeleteStream, crash-safe), and empties
//     (ResetStream) a listed stream whose records belong to a deleted
//     incarnation: the stream was deleted and created again while this
//     node was down, and it then fetches the new stream from offset 0.
//     A node down at the time of the deletion does either when it is
//     back, from the state Raft gives it.
//   - Before either, it deletes the positions a Peat of key layout 3
//     kept of the stream in the node's own state, by its name
//     (mqtt.ForgetLegacy): mqtt's start would move them into a stream
//     created again under that name. A stop in between leaves the copy
//     without them, and the next pass deletes it.
//
// TestSite_DeleteStream runs it on three in-process nodes: refused while
// one lists the stream; deleted on the two alive replicas; created
// again, from offset 0; and the third, down meanwhile with the deleted
// records on disk and the stream listed again, empties them and holds
// the new stream's records only.
// TestSite_DeleteStreamForgetsLayout3Positions deletes a stream whose
// layout 3 positions a node kept, creates it again and starts mqtt on
// the site: they are not in the new stream.
//
// # What is left
//
//   - Sessions: a stream led by an observer of the sessions' stream
//     (a site of more than three nodes) does not fence its session
//     offsets, so a node that lost a session can still land a late
//     offset of it there (a position that goes back, or offsets of an
//     expired session, left behind for the next session of its client
//     id to find). And on an observer of the
//     sessions' stream, a deleted claim the replica applies after this
//     node claimed the key again (a session ended and a new one began
//     faster than the observer's state fetch) closes the new
//     connection once, as a move would (claimsMoved); not seen, and
//     the client reconnects.
//   - Rebalancing on its own (Cruise Control's goals: disk bytes, not
//     replica counts; a stream's records are not counted).
//   - A decommission or rebalance of an acks: leader stream whose
//     leader cannot hand over within handOffLimit still moves it at
//     once, losing what it answered last (logged).
//   - Creating a stream: one created while a just-crashed replica still
//     counts as alive starts with that replica alone in its ISR
//     (createStreams).
package cluster
