// Package status is what an operator looks at: the node status document
// (GET /api/v1/status), the status page at "/" that shows it, and the ring
// of samples behind its rates and sparklines. Package edge fills the
// document; `peat status`, `peat streams`, `peat groups` and `peat check`
// read it back over HTTP with the same types.
//
// # The document
//
//	node        id (host name), version, commit, storage profile, uptime
//	listeners   [{protocol, address}]
//	clients     connected
//	rates       stored, delivered and refused per second over the last minute
//	streams     offsets, records, bytes, oldest record age, retention
//	groups      committed offset, lag in records and seconds, active consumer
//	sessions    durable sessions, connected, the largest lag and whose
//	disk        free, size, reserve, refusing
//	alarms      [{id, severity, message}]: disk_reserve (critical),
//	            disk_low, corrupt_records, file_permissions (warning)
//	history     per-interval rates and the largest group lag, for sparklines
//
// New parts are added beside these, never by changing them: sinks (state,
// lag, last success, last error) are the top-level "sinks" field, a
// stalled one the alarm sink_stalled; a site node's view of its site
// (cluster.SiteStatus: members, controller, leaders, ISR, replica lag) is
// the "cluster" field, with the alarms stream_under_replicated (warning),
// stream_offline (critical) and not_caught_up (warning).
// The page, `peat status` and `peat check` show every alarm by severity.
//
// # The page
//
// page.html is an html/template rendered on every request, so every value
// is in the HTML before any script runs (a phone on a flaky site link, a
// text browser, curl). status.css and status.js are embedded with go:embed
// and served under /assets/: no CDN, no web font, no framework, because
// sites are often offline. The script polls api/v1/status every two
// seconds and rewrites the values, tables and sparklines with the same
// formats as the template (FormatCount, FormatBytes, FormatDuration);
// sparklines are inline SVG polylines drawn from History. A site node's
// page has a site section (members, controller, each stream's leader,
// replicas and in-sync replicas), rendered and refreshed the same way.
//
// # Samples
//
// The node samples its cumulative counters every five seconds into a Ring
// of fixed size (ten minutes). Rates are the difference between a reading
// taken when the document is made and the oldest sample within the last
// minute, so a fresh node reports over what it has. The ring's memory does
// not grow with uptime.
package status
