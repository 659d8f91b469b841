// Package mqtt is Peat's MQTT front-end: a mochi-mqtt server whose hooks put
// every publish on a captured topic into the offset log (ingest) and feed
// subscribers of captured topics from that log (delivery). Topics that no
// stream captures go through mochi unchanged.
//
// # Broker
//
// New builds the mochi server with capabilities sized for small boards
// (Config), an auth hook, the ingest hook and the delivery hook, in that
// order; Start binds the listeners (Config.Listen's, then
// Config.Listeners: MQTT or WebSocket, each with its own TLS); Close
// stops it all.
//
// # Authentication and ACLs (auth.go)
//
// Without Config.Auth everyone may do everything (mochi's allow-all hook).
// With it, the auth hook asks Auth about each CONNECT and keeps the
// client's Access on its connection; mochi asks the hook about publishes
// and subscriptions. A subscription is granted when some topic matching
// it may be read; what is then delivered is checked record by record, in
// deliveryClient.item, the one place every delivery from the log passes
// (the shared reader, a lagging client's cursor, $share groups, $replay
// and $group taps, resumed sessions, retained messages of captured
// topics), with the subscription's filter (the
// one inside $replay and $group), so that Access can answer at once for a
// filter that lies wholly inside an allowed one. A record left out is
// counted in peat_mqtt_dropped_messages_total{reason="not_authorized"}
// and moves a group's or session's position like one that does not
// match. mochi's own deliveries (uncaptured topics and their retained
// messages) pass mochi's per-message ACL check, which the hook answers too. Every
// refusal (bad credentials, a publish, a subscription) is counted in
// peat_mqtt_denied_total{reason} and logged with the client id and remote
// address, rate-limited like connection lines.
//
// Failed logins slow down their source address and user name
// (backoff.go): before Auth checks a CONNECT, it waits out a delay that
// doubles with each recent failure from the same address (logins from it
// queue, so parallel guesses go no faster) or for the same user name (no
// queue: the real user waits at most Config.MaxLoginBackoff), up to
// Config.MaxLoginBackoff; a login that would queue longer is refused
// unchecked (CONNACK 0x9F; 3.1.1: 3) once it has waited that bound. Waits are counted in
// peat_mqtt_login_backoffs_total{by} and
// peat_mqtt_login_backoff_seconds_total, refusals in
// peat_mqtt_denied_total{reason="throttled"}.
//
// Rules change under live connections (revoke.go). Every publish is
// judged under the rules in force when it is read, and a last will when
// it fires. Broker.Revoke, which the node runs after
// each reload, closes the connection of every client whose Access is
// Revocable and revoked (MQTT 5: DISCONNECT 0x87 with the reason, within
// a second however slowly it reads; 3.1.1: closed), counted as
// peat_mqtt_denied_total{reason="revoked"}. A client authenticated under
// the old rules that joins mochi's clients after the walk is caught by the
// revoke hook's OnSessionEstablished.
//
// # Tenancy (tenancy.go)
//
// Groups and sessions belong to someone. $group/<name>/... needs the
// rights to read and write group <name> (Access.MayGroup), and
// $offsets/<group>/<stream> to read it (subscribe) or write it (commit);
// topic rules do not decide them. The group is checked before its
// consumer is looked at, so a refusal (0x87 with a reason string) never
// names another user's client. Groups whose names start with $ (sinks'
// $sink.<name>) are Peat's own: no MQTT client reaches them, with Auth or
// without; the node moves them with Broker.CommitGroup. A CONNECT whose
// client id the client-id rules refuse gets 0x85 (3.1.1: 2), counted as
// denied{reason="client_id"}. A persistent session records the identity
// that made it (Access.Identity: the user, by password or certificate);
// a CONNECT from another identity with its client id, or with the id of
// any live connection of another identity, is refused in
// OnConnectAuthenticate, before mochi looks at the session: CONNACK 0x87
// (3.1.1: 5), counted as denied{reason="session"}; the session is neither
// resumed nor ended, and the owner's connection stays. In a site the
// owner is read from the site's stored session. A session stored without
// an owner (by a Peat before owners, or one run without Auth) is adopted
// by the first identity that connects to it. Known limit: in a site, a
// clean connection (nothing stored) on another broker has no recorded
// owner there, so another identity's persistent CONNECT on this broker
// can still take that client id over.
//
// # Ingest (ingest.go, ingest_conn.go, will.go)
//
// mochi acks a QoS 1/2 publish as soon as OnPublish returns. Peat acks only
// when the record is durable, so the ingest hook takes every publish on a
// captured topic over and hands the record to the stream's appender
// (Stream.AppendAsync). Most are taken in OnPacketRead, before mochi's
// processPublish, which is left a no-op in their place (a PUBACK with packet
// id 0): mochi's read goroutine needs a 32 KiB stack to reach OnPublish and
// 16 KiB to reach OnPacketRead, and with 1,000 sensors that is 16 MB of
// stack, and about as much again of the GC's headroom. The publishes mochi
// must judge (a failed check or ACL, a topic alias, a packet id it has in
// flight) go the long way, and OnPublish takes them over by returning
// packets.ErrRejectPacket, so mochi neither acks nor fans out. Either way,
// the PUBACK (QoS 1) or PUBREC (QoS 2) is written later, by the client's
// ack drainer, when the append is durable:
//
//	read goroutine            appender goroutine        ack drainer (per client, only while acks are pending)
//	OnPacketRead/OnPublish:                             pops completed entries from the head of the
//	  take a window slot  --> AppendAsync ... done: --> client's ack queue, in arrival order, and
//	  (blocks when full)        mark entry, poke        writes PUBACK/PUBREC, or the refusal;
//	  queue ack entry                                   frees the window slot
//
// Many publishes of one client are in flight at once, bounded by
// Config.Window, which is also the Receive Maximum advertised to MQTT 5
// clients. When a client has Window publishes pending, ingest blocks its
// read goroutine: TCP back-pressure, never an unbounded queue. An MQTT 5
// client that opens more QoS 1/2 flows than that (a QoS 2 flow lasts until
// its PUBREL) breaks the Receive Maximum and gets DISCONNECT 0x93; MQTT
// 3.1.1 has no Receive Maximum, so its clients just wait. QoS 0
// publishes take a slot too (freed when their append completes), so a QoS 0
// flood cannot queue unbounded records either.
//
// QoS 2 is exactly once on ingest. On arrival the PUBREC is put into the
// client's mochi Inflight map; mochi's processPubrel then answers PUBREL
// with PUBCOMP. A resent PUBLISH with that
// id before PUBREL is recognised in OnPacketRead (the Inflight entry carries
// our marker in Origin) and answered with a PUBREC in queue order, without
// a second append. Known limit: if a client reconnects while a QoS 2 append
// is still pending, the old connection's not-yet-durable PUBRECs are
// dropped from the session (so the new connection is never acked early);
// the client's resend is then appended again: at least once in that race,
// never lost.
//
// Refusals are never acked: a publish that cannot be stored gets, in queue
// order, a PUBACK/PUBREC with a reason code and reason string (MQTT 5: 0x97
// for a full disk or a payload above max_payload, 0x90 for a reserved topic,
// 0x80 otherwise) or a disconnect (MQTT 3). QoS 0 refusals are dropped. All
// are counted in peat_mqtt_refused_messages_total{reason}. A failing stream
// is logged once when it starts failing and once when it recovers.
//
// Retained messages of captured topics come from the committed log
// (retained.go), so every node serving a stream has them, a restarted one
// too. Each stream has a retained follower that reads its committed records
// in order and, for each with Retain set, sets that topic's retained message
// in Peat's retained set (an empty payload clears it); mochi's own store
// keeps only topics no stream captures. A refused append takes no offset
// and never becomes retained. The follower keeps a compact index in the
// log's StateStore, written with its position in one step: one entry per
// retained topic with the offset of its latest retained record (a cluster
// replicates it with the stream). At start the retained set is rebuilt by
// reading only the indexed records, before the broker serves; the follower
// then reads what came after its stored position (stored with the index
// changes, at most once a second, and at close). Retention is the rule, as
// in Kafka: a retained message lives as long as the record that set it.
// When retention removes that record (or a cluster truncates it) the
// topic's retained message goes, at once on a running broker and at the
// next start otherwise; an older retained record of the topic is not
// brought back. mochi's storage hooks are not told (OnRetainMessage is
// private to mochi); Peat registers none.
//
// Delivery sends a new subscription its retained messages
// (delivery_retained.go), each retained record once: among them or live,
// never both, never neither, and before the live records. Per stream the
// subscription's live records start at the committed offset in
// OnSubscribed (its start, kept with it in delivery's subscription
// index, so a record acked before the SUBSCRIBE that the shared reader
// dispatches later is no live message for it), and its retained messages
// are a snapshot that the
// follower hands over once it has applied exactly the records below that
// offset (on a busy node, or a follower replica whose log just advanced,
// the subscriber waits for it: a retained record acknowledged before the
// SUBSCRIBE is among them). The client is paused in those streams from
// OnSubscribe to OnSubscribed, then a cursor of its own queues the
// snapshot, then its records from where it was paused (leaving out those
// below the start that only the new filter matches), and rejoins the
// shared reader. Retain Handling (0 always, 1 for a new subscription, 2
// never), No Local and ACLs apply as to any delivery; shared subscriptions
// and extension topics get none; what is sent as retained carries the
// retain flag, a live record only with Retain As Published (MQTT 5).
// Clients of mochi's inline client get retained messages of uncaptured
// topics only, as they get only those live.
//
// Last wills are taken from the client when its session is established
// (mochi's sendLWT then skips them), with all their Will Properties (mochi
// keeps only User Properties), and published when the connection ends
// without a DISCONNECT of reason 0x00, after the will delay when one is
// set (cancelled if the client reconnects first): appended to the log on
// a captured topic, handed to mochi as an inline client's publish on
// another. Any other DISCONNECT reason publishes the will: OnPacketRead
// turns it into 0x04, the one mochi honours, taking the code mochi drops
// from a DISCONNECT of remaining length 1 from the guard's framer. A will
// on a captured topic reaches subscribers only through the log, once.
// Closing the broker does not fire wills.
//
// # CONNECT and CONNACK (connect.go)
//
// A will with an empty payload is valid: mochi refuses it, so ingest
// hands mochi a placeholder payload to validate and empties it again in
// OnConnect. An MQTT 3.1.1 client is never sent an MQTT 5 reason code in
// its CONNACK: OnPacketEncode maps each to 3.1.1's return codes 1 to 5
// (an empty client id with Clean Session 0 gets 2).
//
// # Connections (listener.go, connguard.go, connframe.go, packetcheck*.go, panics.go, connlog.go, wsconn.go)
//
// Peat serves mochi through a listener of its own, one per address. With TLS each
// accepted connection is a TLS server connection inside the guard: the
// guard's deadline and pending count cover the handshake, and its framing
// checks read the decrypted bytes. Each connection's bytes pass a guard on
// their way to mochi's reader: it follows the packet framing and closes a
// connection that sends no whole CONNECT within Config.ConnectTimeout,
// announces a CONNECT above Config.MaxConnectSize (mochi allocates the
// announced size before reading), or any packet above the Maximum Packet
// Size; at most Config.MaxPendingConnections may await their CONNACK,
// and Config.MaxPendingPerAddress of them from one source (an IPv4
// address or an IPv6 /64, pending.go); more are closed at once.
//
// No packet reaches mochi's decoders unchecked: mochi v2.7.9 indexes past
// the end of some malformed packets and panics. The guard copies each
// packet's body (a PUBLISH's variable header only; payloads are skipped
// by count) and checks it against the MQTT 3.1.1 and 5 formats before its
// last byte reaches mochi: the type and fixed header flags, every field's
// length, strings' UTF-8, reserved bits, each property allowed where it
// stands, once, in range, and ending at its announced length, non-empty
// topics and filters, Retain Handling 3, Subscription Identifier 0, and
// topic aliases (0 or above the Topic Alias Maximum: 0x94; one never set:
// 0x82). A bad packet closes its connection: an MQTT 5 client gets a
// CONNACK or DISCONNECT with the reason code (0x81 malformed, 0x82 protocol
// error, 0x90 a wildcard in a topic name) and a reason string, an MQTT
// 3.1.1 client is disconnected; each is counted in
// peat_mqtt_closed_connections_total{reason}. Peat does no MQTT 5
// enhanced authentication: a CONNECT naming an Authentication Method gets
// CONNACK 0x8C (bad_auth_method) rather than mochi's success, which would
// leave the client believing its method ran. The packets mochi handled
// before it are answered first. FuzzPacketCheck decodes whatever the
// checks let through with mochi's decoders; FuzzIngress sends a real node
// any bytes after a CONNECT.
//
// If a goroutine serving one client panics all the same (its read
// goroutine, which runs mochi and every hook, or Peat's ack drainer,
// delivery sender and taps), the panic is recovered there: counted in
// peat_mqtt_panics_total, logged at ERROR with the stack, and that
// client's connection closed. A panic on the read goroutine skips mochi's
// end of the read loop, so the broker runs Peat's OnDisconnect hooks and
// drops a clean session itself (Broker.afterPanic). mochi's write
// goroutine is mochi's own: a hook's work there (OnPacketEncode,
// OnPacketSent) is named in its writes rather than its Provides, and the
// broker registers it apart, behind a recover (panics.go).
//
// A WebSocket listener (MQTT over WebSocket, subprotocol "mqtt") is the
// same guard listener with one more step: on its connection goroutine,
// after TLS and before mochi reads, the HTTP upgrade request is read
// (at most 16 KiB, under the connect deadline and in the pending count),
// its Origin checked, and gorilla/websocket's Upgrader answers 101 on the
// hijacked connection (no http.Server: mochi's own WebSocket listener
// allows every origin and sits outside the guard). A page of another
// origin gets 403 (reason websocket_origin), a request that is no
// upgrade 400 (websocket_handshake), both logged like other refusals. A
// request without Origin is no browser's and is not checked. wsConn then
// turns binary messages into the byte stream the guard's framer and
// mochi read (a packet may span messages), each write into one binary
// message, and a text message into a malformed-packet close. How each connection ended is
// logged once, with the remote address and client id, at INFO for a
// client going away or its keepalive lapsing and at WARN for what a client
// did wrong, at most a few lines per cause per 10 s (the next line says
// how many were left out).
//
// # Memory per connection
//
// mochi with default capabilities holds about 145 KB per connection. Peat
// sizes its socket buffers (BufferSize), its outbound channel
// (WritesPending) and Receive Maximum (Window) from Config, and starts no
// goroutine and keeps no state for a client until it publishes to a captured
// topic (an ack drainer lives only while acks are pending). A connection
// costs about 27 KB: 20 KB are the stacks of mochi's two goroutines per
// client (16 KiB of them the read goroutine's), 2 KB the read buffer, the
// rest mochi's client state (plain mochi: about 69 KB). Taking publishes in
// OnPacketRead keeps a publishing client at that; through mochi's
// processPublish its read stack would double to 32 KiB (go run
// ./scripts/stackprobe). With 1,000 sensors publishing QoS 1 at 1 msg/s,
// stacks take about 20 MB, the floor under the broker's RSS for that load
// (make bench-memory).
//
// # Delivery (delivery.go, delivery_reader.go, delivery_cursor.go, delivery_match.go)
//
// Live subscribers of a stream share one reader, so the cost of a record
// is one log read however many subscribers there are. Which connections a
// record goes to comes from delivery's own index of their subscriptions
// (logstore.FilterIndex), not mochi's topic index, which lets '#' miss the
// parent level after '+': routing, ACLs, retained and live delivery
// match by the same rules (logstore.MatchFilter). mochi's index still
// serves topics no stream captures, with what it misses of '#' at the
// parent level added (parentlevel.go): a publish at that level reaches
// the filter's subscribers through OnSelectSubscribers, and a new "P/#"
// subscription gets mochi's retained messages at P too. A QoS 1 subscriber
// that cannot keep up never loses a message and never grows the broker's
// memory: when its queue is full it leaves the shared reader, reads the log
// from the first record it missed with its own cursor, and rejoins when it
// has caught up (no gap, no duplicate). A QoS 0 subscriber takes the same
// path, so a burst larger than its queue loses nothing; only QoS 0 records
// that fall more than Config.QoS0MaxLag records behind the log's end are
// dropped, each counted in peat_mqtt_dropped_messages_total{reason=
// "slow_qos0"} as it falls behind, also while the subscriber reads nothing
// at all; when it reads again it gets the newest QoS0MaxLag records, then
// everything live. The newest records of each stream (2,048, at most 2 MiB)
// are kept in memory by logstore, so a reader at the log's end does not
// touch Badger.
//
// Two mochi v2.7.9 deadlocks shape this package: mochi read-locks a
// client's inflight map twice per packet when the client set a Receive
// Maximum, and a writer waiting in between hangs that client, so Peat
// turns mochi's send quota off and enforces the Receive Maximum in its own
// delivery window; and Server.Close read-locks the clients map twice, so
// Broker.Close bounds it by its context.
//
// # Replay protocol (extension.go, delivery_subscribe.go, delivery_tap.go)
//
// $replay/<from>/+/<filter>, $group/<name>/+/<filter> and
// $offsets/<group>/<stream> are parsed in OnSubscribe, answered in the
// SUBACK (refusals with reason codes and strings, accepted MQTT 5
// subscriptions with user properties stream, start, end, client when
// asked, notice) and served by a tap each: a cursor of its own that reads
// the stream from its start in bounded batches and, at the log's end,
// waits and goes on, so history and live are one loop. Taps push into the
// client's queue and wait for room; the client's sender keeps the window.
//
// A record's publisher (its ClientID) is not part of a delivery: a client
// id names a device, and with it (where no connect rule binds ids to
// users) a way to take its session or, through %c rules, its topics, so
// reading a topic does not reveal who wrote to it. An MQTT 5 $replay or
// $group SUBSCRIBE may ask with the user property client "true" (the
// request holds for its filters, not for a session's resumed ones); the
// SUBACK then carries client "true" after end (this Peat knows the
// request), and each delivery whose record has a client id that
// Access.MayReadClientID lets the subscriber see carries client with it,
// after timestamp: the last property, where no record's own can be.
// Without Auth every id is shown to a client that asks. Consumers that do
// not ask see what they saw before. edge's Peat source asks, so a
// mirror's records keep the publishers HQ lets its user see.
//
// # Writing packets (wire.go, corkconn.go)
//
// Delivery's PUBLISH packets and ingest's successful PUBACKs and PUBRECs
// are encoded by Peat (the same bytes as mochi's encoder, checked by a
// differential fuzz test) and written in one Write each to the client's
// connection, which a writer with several packets ready corks so they
// leave in one syscall. mochi's WritePacket costs about 2 µs per MQTT 5
// packet (a fresh buffer, pooled buffers, a table lookup for every property
// kind); a replay spent 28% of its CPU there. Everything else (CONNACK,
// SUBACK, refusals, mochi's own deliveries of uncaptured topics) goes
// through mochi, and mochi's OnPacketEncode and OnPacketSent hooks see only
// those packets.
//
// # Packet identifiers (packetid.go)
//
// MQTT numbers each direction's packets apart: a client may use for its
// SUBSCRIBE, UNSUBSCRIBE or PUBLISH an id that one of its unacknowledged
// deliveries carries. mochi keeps both directions in one Inflight map per
// client, so Peat keeps its deliveries out of it: it numbers every packet
// toward a client from one allocator per connection, tracks its deliveries
// itself, takes the client's PUBACK/PUBREC/PUBCOMP for them before mochi
// sees them (and writes the PUBREL of a QoS 2 delivery), and gives mochi's
// own deliveries (uncaptured topics and their retained messages) ids from the same
// allocator on the wire, mapping the answers back. mochi's map then holds
// only the client's ids and mochi's own deliveries.
//
// # Topic aliases (topicalias.go)
//
// An MQTT 5 client that offers a Topic Alias Maximum gets up to
// min(that, Config.TopicAliases) aliases, per connection: a topic's first
// PUBLISH carries the topic and an alias, later ones the alias alone; a
// full table gives its least recently used alias to the new topic. mochi's
// own outbound aliases are off, so the numbers are Peat's alone. $replay
// and $group deliveries, whose topics never repeat, carry none.
//
// # Consumer state (groups.go, sessions.go, progress.go, statewriter.go)
//
// Positions belong to the stream they point into: consumer groups'
// committed offsets and durable sessions' offsets live in each stream's
// own state (Stream.WriteState), so a cluster replicates them with the
// stream and the node leading it serves them; when a stream's state moves
// (Stream.StateMoved) delivery loads it again and consumers continue from
// it. The stream also decides a group's single consumer (Stream.Claim).
// Sessions' properties and subscriptions are in the log's StateStore. One
// coalescing writer writes both (state_migrate.go moves what Peats of key
// layout 3 kept in the log's StateStore, by stream name, into the streams
// the log has at start). Those of a stream that is being deleted would go
// into a later stream of the same name, so a deletion drops them first
// (ForgetLegacy, Broker.ForgetLegacy): before the stream's deletion
// begins, so that a stop in between leaves a stream without them, never
// them without their stream (nothing writes such positions any more, so
// none can come back); migrateState and ForgetLegacy take turns, so a
// start never moves what a deletion is dropping. A client connecting
// with Clean Start 0 resumes its stored session whatever Session Expiry
// Interval it gives; that interval decides only whether the session
// outlives this connection. A session that ends with its connection (expiry 0)
// ends at a takeover too: the connection that takes it over gets a new
// one and Session Present 0 (sessions_takeover.go). A progress tracks the end of a consumer's contiguous
// acknowledged prefix; it advances group offsets and session positions.
// Durable sessions are handed to mochi at start through its storage hooks,
// and resume through the same fallback cursor a slow subscriber uses; a
// record an earlier connection of the session was sent is sent again with
// DUP 1 (resend.go: after a restart, and on another broker of a site,
// too, except for records first sent in the last 100 ms before a kill -9).
// In a stream where a resumed session has no position yet, it starts at
// the stream's end as its connection is accepted, before the CONNACK
// (sessions.claim), not when delivery attaches it after the CONNACK. In a
// site (a Log that is SiteSessions) a session is the site's: it is read
// when its client connects to any broker, claimed there (the broker that
// held it closes its connection and stops writing it), and handed to mochi
// then (sessions_site.go); one whose broker died or restarted, or that
// no broker holds, is adopted by one broker of the site, which expires
// it (sessions_orphans.go).
//
// Topic names and filters have at most Config.MaxTopicLevels levels
// (topiclevels.go): a deeper filter is refused in OnSubscribe, before
// mochi's index (which parses each level from the start) or any matcher
// sees it, a deeper publish in ingest, captured or not; counted in
// peat_mqtt_denied_total and peat_mqtt_refused_messages_total
// {reason="topic_levels"}.
//
// Publishes to $replay/... and $group/... are refused: those topics belong
// to the replay protocol; a publish to $offsets/<group>/<stream> commits
// the group's offset (with the right to write the group; never for a $
// group). Malformed packets disconnect that client only.
package mqtt
