package mqtt

// Log attribute keys, one set for the whole front-end. The keys logstore,
// edge and cmd/peat share with it (stream, offset, err, component) are
// spelt the same there.
const (
	attrClient = "client"
	attrUser   = "user"
	attrStream = "stream"
	attrTopic  = "topic"
	attrFilter = "filter"
	attrGroup  = "group"
	attrOffset = "offset"
	attrCount  = "count"
	attrReason = "reason"
	attrErr    = "err"
	attrAddr   = "addr"
	// attrListener and attrProtocol name a listener and what it serves.
	attrListener = "listener"
	attrProtocol = "protocol"
	// attrPart names the part of the front-end a line comes from (mochi,
	// ingest, conn); the node already tags the whole front-end component=mqtt.
	attrPart = "part"

	// Connection lines (connlog.go).
	attrRemote     = "remote"
	attrSuppressed = "suppressed"
	attrLimit      = "limit"
)
