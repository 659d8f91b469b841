// Package cluster runs a site: the nodes that replicate each stream to
// its in-sync replicas (README.md, "A site of Peats"). Serf finds the members and
// tells who is alive, a Raft group of the voters agrees on the site's
// state (the controller), and each stream's leader serves its followers'
// fetches, Kafka's way. The rules (who leads, when the watermark moves,
// when a replica joins or leaves the ISR, where replicas go) are the
// cluster/rules package's, which does no I/O: the loops here watch Serf,
// Raft and the network and call it. `peat serve` runs a Site when the
// configuration has a `cluster:` section (edge/cluster.go).
//
// Each file opens with what it holds and why; this is the map.
//
// # Components
//
//	membership.go     Serf: tags, broker epochs, failure detection, joins
//	heartbeat.go      broker heartbeats to the controller, and fencing
//	controller.go     the Raft group and the controller loop: Serf members
//	                  reconciled with Raft's configuration and the state
//	fsm.go            the raft.FSM over rules.State (copy on apply, snapshots)
//	raftstore.go      Raft's log and stable store in the node's Badger
//	node.go           Node: Serf, Raft and the controller loop of one node
//	submit.go         Node.Submit: a command committed from any node
//	reassign.go       the controller's replica moves and replacements
//	remove.go         RemoveNode, KeepNode: removal and decommission
//	rebalance.go      Site.Rebalance: spreading replicas onto new brokers
//	balance.go        a node's factors, leader balancing, hand-overs
//	replicator.go     Replicator: a Leader or a Fetcher per stream, from the state
//	isr.go            a leader's ISR proposals (rules.ProposeISR), submitted
//	replica_leader.go Leader: serves fetches, moves the high watermark
//	replica_fetcher.go Fetcher: a follower's truncation and fetch loop
//	fetch_silence.go  a silent long-poll connection replaced (replica and state fetch)
//	replica_server.go Server: the cluster transport's connections
//	log.go            Log: the site's streams as the mqtt.Log of one node
//	log_stream.go     stream: appends in call order, reads, the produce path
//	forward.go        a stream's forwarding: what it sends its leader, the codes back
//	forwarder.go      one connection's pipelined appends, deadlines, redials
//	forward_probe.go  a cut-off node's probe of a silent leader
//	forward_resend.go a silent connection's appends sent again on a new one
//	forward_dedup.go  the leader's memory of forwards: each appended once
//	rpcconn.go        one request at a time to a leader or the controller
//	forward_server.go the leader's side of forwarded appends
//	forward_codec.go  a forwarded append's records on the wire
//	log_state_*.go    consumer-state replication (leader, follower) and forwarded writes
//	log_claims.go     claims: a group's single consumer, decided by the leader
//	log_sessions*.go  durable sessions across the site, and their adoption
//	log_mirror.go     mirror streams: records at their source offsets
//	delete.go         deleting a stream from the site
//	site.go           Site: one node of a site, started and handed over
//	status.go         Status and readiness; metrics.go, leader_status.go
//	keyring.go, tls.go gossip encryption and mutual TLS
//	config.go         Config and its defaults; errors.go, the refusals
//	logging.go        Serf's, memberlist's and Raft's logs into slog
//	transport.go      Dialer: TCP, or faultnet in tests
//	rules/            the replication rules, without I/O (its doc lists them)
//	wire/             the cluster transport's frames (its doc draws them)
//	faultnet/         an in-process network that delays, cuts and drops
//	sitetest/         end-to-end tests on real `peat` processes
//
// # Invariants, and where they are kept
//
//  1. At most one controller commits: the Raft leader among the voters
//     (controller.go). Serf alone cannot: it is eventually consistent.
//  2. A refused command changes nothing, on every node alike (fsm.go,
//     rules.Next); the state's own rules are rules/doc.go's.
//  3. A broker epoch is new on every start and never lower than the last
//     (membership.go, raftstore.go's 'e' key): a restarted replica never
//     rejoins an ISR or leads on its old standing (rules, rule 4).
//  4. A leader commits only while its ISR has min_insync_replicas
//     members, its state still names it leader in its epoch, and it is
//     the controller or heard from it within the Raft heartbeat timeout
//     and had a heartbeat sent less than rules.SelfFenceAfter ago counted
//     (replica_leader.go, rules.MayCommit from replicator.go,
//     heartbeat.go): a leader cut off from the controller stops
//     committing, and refuses its producers and its consumer-state
//     writers (log_state_leader.go), before the controller fences it,
//     which it does when Serf declares it failed or its session expires,
//     whichever comes first.
//  5. An ISR change reaches a Leader only once the controller committed
//     it (replicator.go, SetISR): the watermark never moves on a smaller
//     ISR the controller has not agreed to. A larger one is counted from
//     its proposal (the joiners, rules.Tracker): a joiner holds the
//     watermark until the Leader has an ISR with it, also while this
//     node's state holds that ISR before sync hands it over, and after a
//     proposal refused as stale or unanswered; only a refusal in the
//     current version, or a later proposal that leaves it out, drops it,
//     and neither while an unanswered proposal that named it may still
//     commit (the stream still at the version it named:
//     rules.StillJoining, isr.go).
//  6. A node leads only once the state registered its current broker
//     epoch (rules.Leader, from replicator.go).
//  7. No record of an ended leadership lands after the Fetcher that
//     follows it truncated the log: a Leader admits appends until Close
//     or Drain begins, and Close waits for them (replica_leader.go).
//  8. A follower truncates to the new leader's epoch end before it
//     fetches (replica_fetcher.go, rules.TruncateTo).
//  9. An append is acknowledged only on the leader's word that the ISR
//     holds it (acks=all), or that the leader wrote it (acks: leader);
//     a forwarding follower answers once its own watermark passed it too
//     (log_stream.go, forward.go).
//  10. A consumer-state write, a claim included, is answered once every
//     other ISR member acknowledged it, and a replica rejoins the ISR only
//     once it holds the leader's state (log_state_leader.go): whoever is
//     elected holds every answered write.
//  11. One holder per claim: the leader decides claims one at a time, from
//     its replicated state (log_claims.go); a session's writes are fenced
//     by its claim on the leader (log_sessions.go).
//  12. A stream's data is never deleted because a configuration omits it:
//     only DeleteStream, refused while a node lists the stream, deletes
//     it (delete.go).
//  13. Every goroutine has an owner that stops it and waits for it: the
//     Close of Node, Replicator, Leader, Server, Log and Site, a Fetcher's
//     context (leak_test.go checks).
//  14. A forwarded append sent again (its connection went silent) is
//     stored once: the leader answers a Seq it has seen as it answered
//     the first copy, refuses one it forgot, and a follower sends again
//     only to a leader whose tags say it remembers (forward_dedup.go).
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
// # Versions
//
// Nodes of two versions run together during a rolling restart. Raft
// command kinds are never renumbered and fields added later decode as
// zero (rules/doc.go); a node names itself in a state write only to a
// leader whose Serf tags show its own version (log_sessions.go). A new
// command (remove-node of a live node, keep-node, a changed
// replication_factor, rebalance) is used once every node runs the
// version that knows it. A follower sends a forwarded append again only
// to a leader that advertises remembering forwards (tagDedup); to an
// older one it refuses it at the forward timeout, as before.
package cluster
