package status

import (
	"time"

	"github.com/peatmq/peat/cluster"
)

// Status is the document GET /api/v1/status serves and the status page
// shows: one node at a glance. New parts (sinks, cluster) are added as new
// top-level fields and new alarm IDs; a reader ignores what it does not
// know.
type Status struct {
	Node      Node       `json:"node"`
	Listeners []Listener `json:"listeners"`
	Clients   Clients    `json:"clients"`
	Rates     Rates      `json:"rates"`
	Streams   []Stream   `json:"streams"`
	Groups    []Group    `json:"groups"`
	Sessions  Sessions   `json:"sessions"`
	Sinks     []Sink     `json:"sinks"`
	Sources   []Source   `json:"sources"`
	Disk      Disk       `json:"disk"`
	Alarms    []Alarm    `json:"alarms"`
	History   History    `json:"history"`
	// Cluster is the node's view of its site (GET /api/v1/cluster);
	// omitted outside one.
	Cluster *cluster.SiteStatus `json:"cluster,omitempty"`
}

// Node says which node answered and for how long it has run.
type Node struct {
	ID            string    `json:"id"` // the host name until nodes have names of their own
	Version       string    `json:"version"`
	Commit        string    `json:"commit"`
	GoVersion     string    `json:"go_version"`
	Profile       string    `json:"storage_profile"`
	DataDir       string    `json:"data_dir"`
	StartedAt     time.Time `json:"started_at"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	Time          time.Time `json:"time"` // when the document was made
}

// Listener is one address the node serves on.
type Listener struct {
	Protocol string `json:"protocol"` // mqtt, http
	Address  string `json:"address"`
}

// Clients counts the MQTT connections.
type Clients struct {
	Connected int `json:"connected"`
}

// Rates are per-second averages over the last WindowSeconds (a minute once
// the node has run that long).
type Rates struct {
	WindowSeconds float64 `json:"window_seconds"`
	Published     float64 `json:"published_per_second"` // publishes stored
	Delivered     float64 `json:"delivered_per_second"` // records written to subscribers
	Refused       float64 `json:"refused_per_second"`   // publishes refused
}

// Stream is one stream's log.
type Stream struct {
	Name            string   `json:"name"`
	Filters         []string `json:"filters"`
	FirstOffset     uint64   `json:"first_offset"`
	NextOffset      uint64   `json:"next_offset"`
	CommittedOffset uint64   `json:"committed_offset"`
	Records         uint64   `json:"records"` // next_offset - first_offset
	Bytes           int64    `json:"bytes"`
	// OldestAgeSeconds is the age of the oldest record retention still
	// holds; absent when the stream holds none.
	OldestAgeSeconds *float64  `json:"oldest_record_age_seconds,omitempty"`
	Retention        Retention `json:"retention"`
}

// Retention is a stream's bounds; 0 is none.
type Retention struct {
	MaxAgeSeconds float64 `json:"max_age_seconds"`
	MaxBytes      int64   `json:"max_bytes"`
}

// Group is one consumer group's position in one stream.
type Group struct {
	Group  string `json:"group"`
	Stream string `json:"stream"`
	// CommittedOffset is the next offset the group will be given; absent
	// (and the lags with it) for a group that has a consumer but never
	// committed.
	CommittedOffset *uint64 `json:"committed_offset,omitempty"`
	// LagRecords is how many committed records the group has not
	// consumed; LagSeconds how old the first of them is (0 when none).
	LagRecords *uint64  `json:"lag_records,omitempty"`
	LagSeconds *float64 `json:"lag_seconds,omitempty"`
	// Consumer is the client id of the group's active consumer, "" when
	// none is connected.
	Consumer string `json:"consumer"`
}

// Sessions sums up the durable MQTT sessions.
type Sessions struct {
	Durable   int `json:"durable"`
	Connected int `json:"connected"`
	// MaxLagRecords is the most records one session is behind in one
	// stream; MaxLagClient and MaxLagStream say which.
	MaxLagRecords uint64 `json:"max_lag_records"`
	MaxLagClient  string `json:"max_lag_client,omitempty"`
	MaxLagStream  string `json:"max_lag_stream,omitempty"`
}

// Disk is the filesystem under data_dir against the free-space reserve.
type Disk struct {
	Dir          string `json:"dir"`
	Known        bool   `json:"known"` // false in memory, or when statfs failed
	FreeBytes    uint64 `json:"free_bytes"`
	SizeBytes    uint64 `json:"size_bytes"`
	ReserveBytes int64  `json:"reserve_bytes"` // < 0: no check
	Refusing     bool   `json:"refusing"`      // publishes are refused for lack of space
}

// Sink is an upstream sink at a glance: its worst stream's state, its lag
// summed over its streams and its oldest unsent record's age. GET
// /api/v1/sinks has each stream.
type Sink struct {
	Name        string     `json:"name"`
	Kind        string     `json:"kind"` // mqtt, kafka
	Upstream    string     `json:"upstream"`
	State       string     `json:"state"` // connecting, connected, stalled, paused, standby (a site: other nodes lead its streams)
	LagRecords  uint64     `json:"lag_records"`
	LagSeconds  float64    `json:"lag_seconds"`
	LastSuccess *time.Time `json:"last_success,omitempty"` // the last acknowledgement, any stream
	LastError   string     `json:"last_error,omitempty"`
}

// Source is an upstream source at a glance; GET /api/v1/sources has the
// rest.
type Source struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"` // mqtt, kafka, peat
	Upstream string `json:"upstream"`
	Stream   string `json:"stream"`
	State    string `json:"state"` // connecting, connected, stalled, paused, standby (a site: another node leads its stream)
	Received uint64 `json:"received"`
	// LastReceivedSeconds is how long ago the last message came (absent
	// when none came since this node started).
	LastReceivedSeconds *float64 `json:"last_received_seconds,omitempty"`
	LagRecords          *int64   `json:"lag_records,omitempty"` // where the upstream reports it
	LastError           string   `json:"last_error,omitempty"`
}

// Alarm is a condition an operator must act on.
type Alarm struct {
	ID       string `json:"id"`       // stable, for scripts: one of the Alarm* constants
	Severity string `json:"severity"` // SeverityCritical or SeverityWarning
	Message  string `json:"message"`  // what is wrong and what to do
}

// Alarm IDs.
const (
	AlarmUnderReplicated = "stream_under_replicated" // a site stream's ISR is smaller than its replicas
	AlarmStreamOffline   = "stream_offline"          // a site stream has no leader: its publishes are refused
	AlarmNotCaughtUp     = "not_caught_up"           // this site node is outside an ISR, or knows no controller (/readyz 503)
	AlarmSinkStalled     = "sink_stalled"            // a sink has records to send and nothing acknowledged for its stall_after
	AlarmSourceStalled   = "source_stalled"          // a source's messages wait to be stored (or it lags) and nothing was stored for its stall_after
	AlarmDiskReserve     = "disk_reserve"            // free space below the reserve: publishes refused
	AlarmDiskLow         = "disk_low"                // free space below twice the reserve
	AlarmCorruptRecords  = "corrupt_records"         // stored records failed their checksum since start
	AlarmFilePermissions = "file_permissions"        // a users, ACL, tokens, key or keyring file others may read or write
)

// Severities: critical means data is refused or lost now; warning means it
// will be unless someone acts.
const (
	SeverityCritical = "critical"
	SeverityWarning  = "warning"
)

// History is the node's recent past, oldest first, one point per
// IntervalSeconds: what the page's sparklines draw.
type History struct {
	IntervalSeconds float64   `json:"interval_seconds"`
	Published       []float64 `json:"published_per_second"`
	Delivered       []float64 `json:"delivered_per_second"`
	MaxGroupLag     []float64 `json:"max_group_lag_records"`
}

// Critical reports whether any alarm is critical.
func (s *Status) Critical() bool {
	for _, a := range s.Alarms {
		if a.Severity == SeverityCritical {
			return true
		}
	}
	return false
}
