package source

// Log attribute keys.
const (
	attrSource   = "source"
	attrUpstream = "upstream"
	attrStream   = "stream"
	attrStage    = "stage"
	attrReason   = "reason"
	attrErr      = "err"
	attrPaused   = "paused"
	attrTopic    = "topic"
	attrCaptured = "captured_by"
	attrState    = "state"
	attrWaiting  = "waiting"
	attrFor      = "for"
)
