package mqtt

import (
	"fmt"
	"strings"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Topic depth is bounded (Config.MaxTopicLevels). A topic name or filter
// may hold 32,768 levels in its 65,535 bytes, and mochi's topic index
// parses each level from the start of the string: a SUBSCRIBE of 20,000
// levels cost it seconds of CPU, and a PUBLISH of a topic no stream
// captures as much in its fan-out. Peat's own matchers are linear, but
// they still run on input of that size, and nothing a device does needs
// a hundred levels. So a deeper filter is refused in the SUBSCRIBE hook,
// before mochi indexes it, and a deeper topic in ingest, before routing,
// ACLs or mochi see it.

// tooDeep reports whether s, a topic name or filter, has more than max
// levels; a max of 0 (a Config not from DefaultConfig) is the default.
func tooDeep(s string, max int) bool {
	if max <= 0 {
		max = DefaultMaxTopicLevels
	}
	return strings.Count(s, "/") >= max
}

// topicLevelsReason says why a filter or topic was refused.
func topicLevelsReason(what string, max int) string {
	return fmt.Sprintf("%s has more than %d levels (max_topic_levels)", what, max)
}

// codeTopicLevels is a refused publish's MQTT 5 reason.
func codeTopicLevels(max int) packets.Code {
	return packets.Code{Code: packets.ErrTopicNameInvalid.Code, Reason: topicLevelsReason("topic name", max)}
}
