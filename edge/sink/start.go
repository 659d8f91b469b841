package sink

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Start is where a sink begins in a stream it has no position in.
type Start struct {
	kind   startKind
	offset uint64
	time   time.Time
}

type startKind uint8

const (
	startEarliest startKind = iota
	startLatest
	startOffset
	startTime
)

// ParseStart reads "earliest", "latest", a decimal offset or an RFC 3339
// time.
func ParseStart(s string) (Start, error) {
	switch s {
	case "", "earliest":
		return Start{kind: startEarliest}, nil
	case "latest":
		return Start{kind: startLatest}, nil
	}
	if s[0] >= '0' && s[0] <= '9' && !strings.ContainsAny(s, "-:T") {
		off, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return Start{}, fmt.Errorf("%q is not an offset", s)
		}
		return Start{kind: startOffset, offset: off}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return Start{}, fmt.Errorf("%q: want earliest, latest, an offset or an RFC 3339 time", s)
	}
	return Start{kind: startTime, time: t}, nil
}

func (st Start) String() string {
	switch st.kind {
	case startLatest:
		return "latest"
	case startOffset:
		return strconv.FormatUint(st.offset, 10)
	case startTime:
		return st.time.Format(time.RFC3339Nano)
	}
	return "earliest"
}

// resolve is the offset st names in s now. An offset outside the log is
// moved to its start or end.
func (st Start) resolve(s Stream) (uint64, error) {
	switch st.kind {
	case startLatest:
		return s.Committed(), nil
	case startOffset:
		return min(max(st.offset, s.FirstOffset()), s.Committed()), nil
	case startTime:
		return s.OffsetForTime(st.time)
	}
	return s.FirstOffset(), nil
}
