package sink

// Attribute keys of the sinks' log lines.
const (
	attrSink       = "sink"
	attrStream     = "stream"
	attrOffset     = "offset"
	attrStart      = "start"
	attrFrom       = "from"
	attrTo         = "to"
	attrCount      = "count"
	attrEnd        = "end"
	attrErr        = "err"
	attrReason     = "reason"
	attrStage      = "stage"
	attrUpstream   = "upstream"
	attrWindow     = "window"
	attrPaused     = "paused"
	attrLag        = "lag_records"
	attrStallAfter = "stall_after"
	attrState      = "state"
	attrEpoch      = "leader_epoch"
	attrLeader     = "leader"
)
