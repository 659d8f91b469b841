package mqtt

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
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
		return extFilter{kind: extNone}, nil
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
	if err := validFilter(inner); err != nil {
		return extFilter{}, extErrorf("%s: filter %q: %v", name, inner, err)
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

// validFilter checks an MQTT topic filter: '+' and '#' occupy whole levels,
// '#' only last.
func validFilter(f string) error {
	levels := strings.Split(f, "/")
	for i, l := range levels {
		switch {
		case l == "#" && i != len(levels)-1:
			return errors.New("'#' must be the last level")
		case l != "+" && l != "#" && strings.ContainsAny(l, "+#"):
			return fmt.Errorf("level %q: a wildcard must be a whole level", l)
		}
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

// topicMatches reports whether topic matches the MQTT filter f. Wildcards at
// the first level do not match topics starting with '$'.
func topicMatches(f, topic string) bool {
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(f, "+") || strings.HasPrefix(f, "#")) {
		return false
	}
	for {
		fl, frest, fmore := strings.Cut(f, "/")
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
		f, topic = frest, trest
	}
}

// maxFilterProbes bounds the topics filterStreams tries.
const maxFilterProbes = 50000

// errFilterTooWide: filterStreams could not tell which streams a filter
// reads within maxFilterProbes topics.
var errFilterTooWide = errors.New("too many stream filters to check this filter against")

// filterStreams returns the streams that capture at least one topic
// matching filter (the stream with the most specific filter wins each
// topic, see Log.Route).
//
// It routes a set of probe topics that stands for every topic the filter
// matches: at a wildcard level, each literal some stream filter names at
// that depth, plus one level no filter names (all such levels route
// alike); '#' also tries every length up to one past the deepest stream
// filter. Routing depends only on which filter levels a topic's levels
// equal, so the probes reach every stream a real topic could.
func filterStreams(l Log, filter string) ([]Stream, error) {
	const fresh = "\x00" // a level no filter names: not a valid MQTT topic level
	var lits []map[string]bool
	for _, s := range l.Streams() {
		for _, f := range s.Filters() {
			for i, lv := range strings.Split(f, "/") {
				for len(lits) <= i {
					lits = append(lits, map[string]bool{})
				}
				if lv != "+" && lv != "#" {
					lits[i][lv] = true
				}
			}
		}
	}
	choices := func(depth int) []string {
		out := []string{fresh}
		if depth < len(lits) {
			for lv := range lits[depth] {
				if depth == 0 && strings.HasPrefix(lv, "$") {
					continue // top-level wildcards never match $ topics
				}
				out = append(out, lv)
			}
		}
		return out
	}
	seen := map[string]Stream{}
	var order []Stream
	probes := 0
	route := func(levels []string) error {
		if probes++; probes > maxFilterProbes {
			return errFilterTooWide
		}
		if s := l.Route(strings.Join(levels, "/")); s != nil && seen[s.Name()] == nil {
			seen[s.Name()] = s
			order = append(order, s)
		}
		return nil
	}
	flevels := strings.Split(filter, "/")
	var walk func(i int, topic []string) error
	walk = func(i int, topic []string) error {
		if i == len(flevels) {
			return route(topic)
		}
		switch lv := flevels[i]; lv {
		case "+":
			for _, c := range choices(len(topic)) {
				if err := walk(i+1, append(topic, c)); err != nil {
					return err
				}
			}
			return nil
		case "#":
			return hashProbes(topic, len(lits)+1, choices, route)
		default:
			return walk(i+1, append(topic, lv))
		}
	}
	if err := walk(0, make([]string, 0, len(flevels)+len(lits)+1)); err != nil {
		return order, err
	}
	return order, nil
}

// hashProbes routes topic followed by every sequence of probe levels up to
// depth levels in all ("a/#" also matches "a"; "#" alone needs one level).
func hashProbes(topic []string, depth int, choices func(int) []string, route func([]string) error) error {
	if len(topic) > 0 {
		if err := route(topic); err != nil {
			return err
		}
	}
	if len(topic) >= depth {
		return nil
	}
	for _, c := range choices(len(topic)) {
		if err := hashProbes(append(topic, c), depth, choices, route); err != nil {
			return err
		}
	}
	return nil
}
