package mqtt

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/peatmq/peat/logstore"
)

// The replay protocol's extension topics (DESIGN.md, "Extension topics"):
//
//	$replay/<from>/+/<filter>   history of <filter> from <from>, then live
//	$group/<name>/+/<filter>    a named durable cursor over <filter>
//	$offsets/<group>/<stream>   a group's committed offset (subscribe, publish)
//
// The '+' level is where each delivery carries its record's offset:
// $replay/<from>/<offset>/<original topic>, so the delivered topic matches
// the subscribed filter and shows the offset.

// Prefixes of the extension topics.
const (
	replayPrefix  = "$replay/"
	groupPrefix   = "$group/"
	offsetsPrefix = "$offsets/"
)

// extKind tells which extension a filter uses.
type extKind uint8

const (
	extNone    extKind = iota // an ordinary filter
	extReplay                 // $replay/<from>/+/<filter>
	extGroup                  // $group/<name>/+/<filter>
	extOffsets                // $offsets/<group>/<stream>
)

// extFilter is a parsed extension filter.
type extFilter struct {
	kind   extKind
	from   position // extReplay
	group  string   // extGroup, extOffsets
	stream string   // extOffsets
	inner  string   // extReplay, extGroup: the filter over original topics
	// head is what precedes the offset level in delivered topics:
	// "$replay/<from>/" or "$group/<name>/".
	head string
}

// errExtension marks a malformed extension filter; the message says what is
// wrong and is sent to the client as the SUBACK's reason string.
var errExtension = errors.New("bad extension filter")

func extErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errExtension}, args...)...)
}

// parseExtension parses a subscription filter. An ordinary filter gives
// kind extNone and no error. An extension filter that breaks the grammar
// gives an error wrapping errExtension that says what is wrong.
func parseExtension(filter string, now time.Time) (extFilter, error) {
	var kind extKind
	var rest string
	switch {
	case strings.HasPrefix(filter, replayPrefix):
		kind, rest = extReplay, filter[len(replayPrefix):]
	case strings.HasPrefix(filter, groupPrefix):
		kind, rest = extGroup, filter[len(groupPrefix):]
	case strings.HasPrefix(filter, offsetsPrefix):
		return parseOffsetsTopic(filter)
	default:
		return extFilter{kind: extNone}, sharedExtension(filter)
	}
	name := map[extKind]string{extReplay: "$replay", extGroup: "$group"}[kind]
	arg, rest, ok := strings.Cut(rest, "/")
	if !ok || arg == "" {
		return extFilter{}, extErrorf("%s needs %s/<%s>/+/<filter>", name, name, map[extKind]string{extReplay: "from", extGroup: "name"}[kind])
	}
	level, inner, ok := strings.Cut(rest, "/")
	if level != "+" {
		return extFilter{}, extErrorf("%s: the level after %q must be '+' (it carries each record's offset), got %q", name, arg, level)
	}
	if !ok || inner == "" {
		return extFilter{}, extErrorf("%s: no filter after the '+' offset level", name)
	}
	if err := logstore.ValidateFilter(inner); err != nil {
		return extFilter{}, extErrorf("%s: %v", name, err)
	}
	if strings.HasPrefix(inner, "$") {
		return extFilter{}, extErrorf("%s: filter %q: $ topics are not stored", name, inner)
	}
	f := extFilter{kind: kind, inner: inner, head: filter[:len(filter)-len(inner)-len("+/")]}
	if kind == extGroup {
		if err := validName(arg); err != nil {
			return extFilter{}, extErrorf("$group: name %q: %v", arg, err)
		}
		f.group = arg
		return f, nil
	}
	from, err := parsePosition(arg, now)
	if err != nil {
		return extFilter{}, extErrorf("$replay: <from> %q: %v", arg, err)
	}
	f.from = from
	return f, nil
}

// sharePrefix starts a shared subscription, $share/<name>/<filter>. mochi
// takes it off (in any case, as mochi does) and serves the filter to one
// member of the group at a time; routing and the extension grammar never
// see it.
const sharePrefix = "$share/"

// sharedExtension refuses a shared subscription to an extension topic:
// mochi would grant it and it would never get a message, since extension
// deliveries are a client's own. $group is the way to share a stream's
// records out, one consumer at a time.
func sharedExtension(filter string) error {
	if len(filter) <= len(sharePrefix) || !strings.EqualFold(filter[:len(sharePrefix)], sharePrefix) {
		return nil
	}
	_, inner, _ := strings.Cut(filter[len(sharePrefix):], "/")
	for _, p := range []string{replayPrefix, groupPrefix, offsetsPrefix} {
		if strings.HasPrefix(inner, p) {
			return extErrorf("%s cannot be a shared subscription ($share/<name>/...)", strings.TrimSuffix(p, "/"))
		}
	}
	return nil
}

// parseOffsetsTopic parses $offsets/<group>/<stream>, as a filter or as the
// topic of a publish that commits an offset.
func parseOffsetsTopic(topic string) (extFilter, error) {
	rest := strings.TrimPrefix(topic, offsetsPrefix)
	group, stream, ok := strings.Cut(rest, "/")
	if !ok {
		return extFilter{}, extErrorf("$offsets needs $offsets/<group>/<stream>")
	}
	if err := validName(group); err != nil {
		return extFilter{}, extErrorf("$offsets: group %q: %v", group, err)
	}
	if err := validName(stream); err != nil {
		return extFilter{}, extErrorf("$offsets: stream %q: %v", stream, err)
	}
	return extFilter{kind: extOffsets, group: group, stream: stream}, nil
}

// validName checks a group or stream name: one non-empty topic level
// without wildcards.
func validName(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case strings.ContainsAny(s, "+#"):
		return errors.New("wildcards are not allowed")
	case strings.Contains(s, "/"):
		return errors.New("must be one topic level")
	}
	return nil
}

// posKind is what a <from> names.
type posKind uint8

const (
	posEarliest posKind = iota // the log start
	posLatest                  // the log end: only new records
	posOffset                  // an offset
	posTime                    // the first record at or after a time
)

// position is a parsed <from>.
type position struct {
	kind   posKind
	offset uint64
	at     time.Time
}

func (p position) String() string {
	switch p.kind {
	case posEarliest:
		return "earliest"
	case posLatest:
		return "latest"
	case posOffset:
		return strconv.FormatUint(p.offset, 10)
	default:
		return p.at.UTC().Format(time.RFC3339Nano)
	}
}

// maxRelative bounds a negative duration: longer than any retention, short
// enough not to overflow time arithmetic.
const maxRelative = 100 * 365 * 24 * time.Hour

// parsePosition parses a <from>: earliest, latest, a decimal offset, a
// negative duration (-15m, -2h, -7d, or any Go duration such as -1h30m)
// meaning that long before now, or an RFC 3339 time.
func parsePosition(s string, now time.Time) (position, error) {
	switch s {
	case "earliest":
		return position{kind: posEarliest}, nil
	case "latest":
		return position{kind: posLatest}, nil
	case "":
		return position{}, errors.New("empty")
	}
	if s[0] >= '0' && s[0] <= '9' && !strings.ContainsAny(s, "T:-") {
		off, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return position{}, fmt.Errorf("not an offset: %w", err)
		}
		return position{kind: posOffset, offset: off}, nil
	}
	if s[0] == '-' {
		d, err := parseAgo(s[1:])
		if err != nil {
			return position{}, err
		}
		return position{kind: posTime, at: now.Add(-d)}, nil
	}
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return position{}, errors.New("want earliest, latest, an offset, a negative duration such as -15m, -2h or -7d, or an RFC 3339 time")
	}
	return position{kind: posTime, at: at}, nil
}

// parseAgo parses the duration of a "-<duration>" position, with "d" for
// days besides Go's units.
func parseAgo(s string) (time.Duration, error) {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok && days != "" && !strings.ContainsAny(days, "hmsuµn.") {
		n, err := strconv.ParseUint(days, 10, 32)
		if err != nil || n > uint64(maxRelative/(24*time.Hour)) {
			return 0, fmt.Errorf("bad number of days %q", days)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("bad duration %q: want e.g. -15m, -2h, -7d", "-"+s)
		}
	}
	if d <= 0 || d > maxRelative {
		return 0, fmt.Errorf("duration -%s out of range", s)
	}
	return d, nil
}

// streamsReached returns the streams that some topic matching filter is
// routed to, in the order of l.Streams(): logstore's Router over the
// streams' filters, which routes as l.Route does (most specific filter
// wins; the single-node store is that Router).
func streamsReached(l Log, filter string) ([]Stream, error) {
	streams := l.Streams()
	filters := make([][]string, len(streams))
	for i, s := range streams {
		filters[i] = s.Filters()
	}
	r, err := logstore.NewRouter(filters)
	if err != nil {
		return nil, fmt.Errorf("route the log's streams: %w", err)
	}
	reached := r.Reach(filter)
	out := make([]Stream, len(reached))
	for i, s := range reached {
		out[i] = streams[s]
	}
	return out, nil
}
