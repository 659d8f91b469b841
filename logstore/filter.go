package logstore

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Topic filters, as MQTT 3.1.1 and 5 define them (§4.7 in both): levels
// separated by '/', '+' matching exactly one level and '#' the rest of the
// topic, parent level included. This file holds the one validator and the
// one matcher Peat has for them; routing (route.go), the indexes of many
// topics or filters (topicindex.go) and every front-end follow these. Shared subscriptions ($share/<name>/<filter>) are not a filter
// syntax here: the front-end takes the prefix off (mochi does, for
// ordinary subscriptions), and a stream cannot capture one
// (Config.Validate).

// maxFilterBytes is the longest filter or topic an MQTT string can hold.
const maxFilterBytes = 65535

// ValidateFilter checks an MQTT topic filter: non-empty, at most 65535
// bytes of valid UTF-8 without U+0000, '+' alone in its level, '#' alone in
// the last level [MQTT-4.7.1-1] [MQTT-4.7.1-2] [MQTT-4.7.3-1]
// [MQTT-4.7.3-2]. Empty levels are valid ("a//b", "/a").
func ValidateFilter(f string) error {
	if f == "" {
		return errors.New("empty topic filter")
	}
	if len(f) > maxFilterBytes {
		return errors.New("topic filter longer than 65535 bytes")
	}
	if !utf8.ValidString(f) || strings.IndexByte(f, 0) >= 0 {
		return fmt.Errorf("topic filter %q is not valid UTF-8 or contains NUL", f)
	}
	for rest, more := f, true; more; {
		var l string
		l, rest, more = strings.Cut(rest, "/")
		switch {
		case l == "#" && more:
			return fmt.Errorf("topic filter %q: '#' must be the last level", f)
		case l != "#" && strings.IndexByte(l, '#') >= 0:
			return fmt.Errorf("topic filter %q: '#' must occupy a whole level", f)
		case l != "+" && strings.IndexByte(l, '+') >= 0:
			return fmt.Errorf("topic filter %q: '+' must occupy a whole level", f)
		}
	}
	return nil
}

// MatchFilter reports whether topic matches filter. filter must be valid
// (ValidateFilter) and topic a topic name (no wildcards); other input gives
// an unspecified answer, never a panic. '+' and '#' at the first level do
// not match a topic starting with '$' [MQTT-4.7.2-1]; "a/#" matches "a".
// It does not allocate.
func MatchFilter(filter, topic string) bool {
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	for {
		fl, frest, fmore := strings.Cut(filter, "/")
		if fl == "#" {
			return true
		}
		tl, trest, tmore := strings.Cut(topic, "/")
		if fl != "+" && fl != tl {
			return false
		}
		switch {
		case !fmore && !tmore:
			return true
		case !tmore:
			return frest == "#" // "a/#" matches "a"
		case !fmore:
			return false
		}
		filter, topic = frest, trest
	}
}
