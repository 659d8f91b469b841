// Package edge wires one Peat node together: the YAML configuration (the
// only place YAML tags live), the node's lifecycle (storage profile and Go
// memory limit, the logstore, the MQTT front-end, the HTTP server) and the
// HTTP API.
//
// # Configuration
//
// A Config starts from DefaultConfig (what `peat serve` runs with no
// arguments), then a YAML file (LoadFile; unknown fields are errors), then
// the environment (ApplyEnv: PEAT_DATA_DIR, PEAT_MQTT_LISTEN,
// PEAT_HTTP_LISTEN, PEAT_STORAGE_PROFILE, PEAT_LOG_LEVEL, PEAT_LOG_FORMAT),
// then command-line flags (Set). Validate reports every problem at once, each
// named by its YAML path ("streams[0].durability: ..."), and says where a
// value came from when it was not the file ("mqtt.listen (from flag
// --mqtt): ..."). The storage and MQTT packages validate their own fields;
// edge maps their field names to YAML paths.
//
// # Lifecycle
//
// New checks the configuration and builds the node's Prometheus registry; it
// does no I/O. Start applies the storage profile's Go memory limit (unless
// GOMEMLIMIT is set), opens the log, starts the MQTT broker and the HTTP
// server. Close stops the HTTP server, then the sources and sinks (their
// position commits still under way get 5 s: runners, sinks.go), then the
// broker (no new connections or publishes), then closes the log (flush,
// close Badger), and is idempotent.
//
// With a `cluster:` section (config_cluster.go) the store opens with
// ManualCommit and Start joins the site (cluster.StartSite, cluster.go)
// before the broker starts; the broker gets the site's Log, wrapped so
// that a topic of a configured stream this node does not serve yet is
// refused rather than passed through unstored, and routed by every
// configured stream's filters. Close stops the broker, then the site
// (which hands its streams over first), then the store.
//
// # HTTP
//
//	GET /healthz         200 "ok" while the node serves, 503 otherwise
//	GET /readyz          /healthz, and 503 with the reason while publishes
//	                     are refused for disk space or, in a site, while
//	                     the node has not caught up (cluster.Site.CaughtUp)
//	GET /metrics         Prometheus text format: Go and process collectors,
//	                     logstore metrics (with per-stream offset gauges)
//	                     and MQTT metrics
//	GET /api/v1/streams  [{"name","filters","first_offset","next_offset",
//	                       "committed_offset","bytes"}], then the stored
//	                     streams the configuration no longer lists, with
//	                     "unlisted": true
//	GET /api/v1/streams/{name}  one stream, 404 when there is none
//	DELETE /api/v1/streams/{name}  delete an unlisted stream (`peat stream
//	                     delete`): 200 {"name","records","bytes"}; in a site
//	                     202 {"name","site":true} once the controller
//	                     recorded it; 409 for a stream the configuration
//	                     (in a site: any node's) lists, 404 for an unknown
//	                     one, 503 on a single node still starting
//	                     (streams_delete.go)
//	GET /api/v1/status   the node at a glance (package status documents it)
//	GET /api/v1/groups   the consumer groups of the status document
//	GET /api/v1/cluster  a site node's view of its site (cluster.SiteStatus),
//	                     also the "cluster" block of /api/v1/status; 404
//	                     outside a site (http_cluster.go)
//	GET /api/v1/sinks    upstream sinks: state, position and lag per stream
//	                     (sink.Status); /api/v1/sinks/{name} one of them
//	POST /api/v1/sinks/{name}/pause, .../resume  until the node restarts
//	POST /api/v1/cluster/nodes/{id}/remove  member id leaves the site: the
//	                     controller moves its replicas, draining it first
//	                     while it is alive (202 {"node","moving","draining"};
//	                     409 when refused, 404 for an unknown one)
//	POST /api/v1/cluster/nodes/{id}/keep  ends member id's drain (200
//	                     {"node"}; 409 once it is removed, 404 unknown)
//	POST /api/v1/cluster/rebalance  spreads replicas over the brokers,
//	                     counts within one (202 {"moves","replicas",
//	                     "balanced"}; 200 with no moves: nothing to do;
//	                     409 when the controller refused the plan)
//	GET /                the status page (package status)
//
// The status document is made on request from the store, the broker's
// read-only views (mqtt's Broker.Groups and Broker.Sessions) and a ring of
// counter samples a goroutine of the node takes every five seconds
// (statusdoc.go). /metrics adds, at scrape time, peat_build_info and per
// group and stream peat_group_lag_records and
// peat_group_consumer_connected (metrics.go); per-client and per-session
// series are left out on purpose: there may be thousands. A site node
// also registers cluster.Collector (peat_cluster_*, peat_stream_isr_size,
// peat_replica_lag_records, ...), which reads the site's status at scrape
// time.
//
// Sinks (sinks.go, config_sinks.go; package sink) start after the broker,
// with their positions kept as its consumer groups "$sink.<name>"
// (sink_positions.go), and stop before it. In a site (sinks_site.go)
// every node runs every sink, but a sink sends a stream only from the
// node whose Replicator leads it (siteLeadership), and loads its position
// from that node's replica of the stream's state, where every answered
// commit is (sitePositions); commits go through the broker to the
// stream's leader and its ISR. {node} is the cluster node id there, the
// upstream client id gets "-<node_id>" and the Kafka transactional id
// ".<node_id>", since nodes leading different streams of one sink are
// connected at the same time.
//
// Sources (sources.go, config_sources.go; package source) start after the
// sinks and stop before them. Each appends through the broker's log
// (sourceLog: in a site the cluster's, so an append on the leader is
// committed once the ISR holds it) to one stream: the one it names, or
// the one stream its mapped topics reach (Config.sourceStream, checked at
// validation with logstore.Router.Reach). Its mark, the group
// "$source.<name>", is kept as the sinks' positions are; in a site it runs
// on the node that leads its stream (the same siteLeadership), with the
// same client id on every node, so the upstream session moves with the
// leadership. A kind of source is a block of SourceConfig (sourceKind:
// validate, mapped, upstream). Sinks skip records whose peat-origin is
// their own upstream (sink.Originer), so a sink and a source on one
// broker do not loop.
//
// Errors are JSON: {"error": "message"}.
//
// # Security (config_auth.go, node_auth.go, http_auth.go)
//
// Users, ACLs and API tokens live in edge/auth; edge reads the files at
// start (a file that cannot be read or is invalid fails the start) and
// adapts them to mqtt.Auth. Validate refuses a listener reachable from the
// network (any address but loopback or localhost) that would let anyone
// in, unless auth.allow_anonymous says so, or would run without TLS,
// unless mqtt.allow_plaintext (http.allow_plaintext) says so; each error
// names the fields to set. mqtt.listen, mqtt.tls and mqtt.allow_plaintext
// are the short form of one MQTT listener; mqtt.listeners lists several
// (config_listeners.go), and every check applies to each, named by its
// path (mqtt.listeners[1].listen). cert_identity is a listener's: a
// certificate shown to a listener without it names no user. Node.Reload (SIGHUP in cmd/peat) reads users,
// ACL, tokens and the listeners' certificates again and keeps what is in
// force when a file is bad.
// With http.tokens_file every path but /healthz and /readyz needs
// "Authorization: Bearer <token>" (401 without, 403 for a read token on a
// method other than GET and HEAD), counted in peat_http_denied_total.
// Before the token, http_browser.go refuses what a page of another site
// could make a browser send: a change (any method but GET, HEAD, OPTIONS)
// without Content-Type application/json, Authorization or X-Peat-Request
// (415) or from another origin (403); without tokens, a Host that does
// not name the node (DNS rebinding, 403; http.allowed_hosts), and any
// change on a network listener (403: auth.allow_anonymous opens reads
// only).
// A users, ACL, tokens, key or keyring file its group or others may read
// or write is warned of at start and is the status alarm file_permissions
// (filemodes.go), which `peat check` reports as a WARNING.
package edge
