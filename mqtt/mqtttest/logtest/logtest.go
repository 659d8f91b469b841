// Package logtest is the contract suite for mqtt.Log: every promise written
// in mqtt/log.go, as subtests that any implementation runs with
//
//	func TestLog(t *testing.T) {
//		logtest.TestLog(t, logtest.Suite{Open: open, Reopen: true, Expire: expire})
//	}
//
// (as hashicorp/raft ships testing.go for its stores). mqtttest's tests run
// it against the in-memory MemLog, edge's tests against the Badger-backed
// logstore: where two implementations disagree, one breaks the contract.
//
// It is a package of its own because it needs mqtt's interface types while
// mqtt's internal tests import mqtttest: see mqtttest's package doc.
package logtest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// Deadline only keeps a broken implementation from hanging the suite: every
// wait is on observable state (a done call, a closed channel), and no
// correct implementation comes near it.
const Deadline = 30 * time.Second

// Open opens the log kept in dir with the given streams, each
// "name=filter[,filter]", and returns it with the function that closes it
// (idempotent). dir is a fresh t.TempDir(), or the dir of a log the suite
// has just closed when it checks a reopen.
type Open func(t *testing.T, dir string, specs ...string) (l mqtt.Log, close func() error)

// Suite is one implementation under test.
type Suite struct {
	Open Open
	// Reopen: a log opened on the dir of a closed one holds its committed
	// records, offsets and state (a persistent implementation).
	Reopen bool
	// Expire drops the oldest records of s whose timestamp is before
	// before, as retention by age does. nil for an implementation without
	// retention: the checks of reads below the log start are then left out.
	Expire func(t *testing.T, s mqtt.Stream, before time.Time)
	// OpenFull is Open for a log on a full disk: it refuses every append
	// for lack of space. nil leaves that check out.
	OpenFull Open
	// AddStream adds the stream of a "name=filter[,filter]" spec to l while
	// it runs, and RemoveStream removes one (as a cluster controller
	// would). nil (both) leaves the checks of WatchStreams' changes out;
	// its initial events and close are checked anyway.
	AddStream    func(t *testing.T, l mqtt.Log, spec string)
	RemoveStream func(t *testing.T, l mqtt.Log, name string)
}

// TestLog runs every check of the contract as a subtest.
func TestLog(t *testing.T, s Suite) {
	if s.Open == nil {
		t.Fatal("logtest: Suite.Open is nil")
	}
	tests := []struct {
		name string
		run  func(*testing.T, Suite)
	}{
		{"Route", testRoute},
		{"Streams", testStreams},
		{"AppendOffsets", testAppendOffsets},
		{"AppendDoneOrder", testAppendDoneOrder},
		{"AppendRefused", testAppendRefused},
		{"AppendEmpty", testAppendEmpty},
		{"ReadBounds", testReadBounds},
		{"ReadLimits", testReadLimits},
		{"ReadLong", testReadLong},
		{"OffsetForTime", testOffsetForTime},
		{"ChangedWakes", testChangedWakes},
		{"NoLostWakeup", testNoLostWakeup},
		{"State", testState},
		{"StateLimit", testStateLimit},
		{"StreamState", testStreamState},
		{"Claim", testClaim},
		{"WatchStreams", testWatchStreams},
		{"Close", testClose},
		{"CloseRacing", testCloseRacing},
	}
	if s.Expire != nil {
		tests = append(tests, struct {
			name string
			run  func(*testing.T, Suite)
		}{"ReadBelowStart", testReadBelowStart})
	}
	if s.OpenFull != nil {
		tests = append(tests, struct {
			name string
			run  func(*testing.T, Suite)
		}{"AppendNoSpace", testAppendNoSpace})
	}
	if s.AddStream != nil && s.RemoveStream != nil {
		tests = append(tests, struct {
			name string
			run  func(*testing.T, Suite)
		}{"StreamChanges", testStreamChanges})
	}
	if s.Reopen {
		tests = append(tests, struct {
			name string
			run  func(*testing.T, Suite)
		}{"Reopen", testReopen})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, s) })
	}
}

// open opens a log in a fresh dir and closes it at cleanup.
func (s Suite) open(t *testing.T, specs ...string) (mqtt.Log, func() error) {
	t.Helper()
	return s.openIn(t, t.TempDir(), specs...)
}

func (s Suite) openIn(t *testing.T, dir string, specs ...string) (mqtt.Log, func() error) {
	t.Helper()
	l, closeLog := s.Open(t, dir, specs...)
	t.Cleanup(func() {
		if err := closeLog(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return l, closeLog
}

// stream opens a log with one stream "default" capturing "#".
func (s Suite) stream(t *testing.T) (mqtt.Log, mqtt.Stream, func() error) {
	t.Helper()
	l, closeLog := s.open(t, "default=#")
	return l, only(t, l), closeLog
}

func only(t *testing.T, l mqtt.Log) mqtt.Stream {
	t.Helper()
	ss := l.Streams()
	if len(ss) != 1 {
		t.Fatalf("Streams() has %d streams, want 1", len(ss))
	}
	return ss[0]
}

// result is what one done call reported.
type result struct {
	first uint64
	err   error
}

// appendWait appends recs and waits for done.
func appendWait(t *testing.T, s mqtt.Stream, recs ...*logstore.Record) result {
	t.Helper()
	ch := make(chan result, 1)
	s.AppendAsync(recs, func(first uint64, err error) { ch <- result{first, err} })
	select {
	case r := <-ch:
		return r
	case <-time.After(Deadline):
		t.Fatalf("append to %s: done not called within %v", s.Name(), Deadline)
		return result{}
	}
}

// mustAppend appends recs, fails the test unless that succeeds, and
// returns the first offset.
func mustAppend(t *testing.T, s mqtt.Stream, recs ...*logstore.Record) uint64 {
	t.Helper()
	r := appendWait(t, s, recs...)
	if r.err != nil {
		t.Fatalf("append %d records to %s: %v", len(recs), s.Name(), r.err)
	}
	return r.first
}

// rec is a record of topic with a payload that makes Record.Size exactly
// size (at least the empty record's).
func rec(topic string, size int) *logstore.Record {
	r := &logstore.Record{Topic: topic, QoS: 1}
	r.Payload = make([]byte, max(0, size-r.Size()))
	for i := range r.Payload {
		r.Payload[i] = byte('a' + i%26)
	}
	return r
}

// recs is n records "t/<i>" of Record.Size 100, QoS 1 at even i and 0
// at odd i (so single-record appends take an implementation's QoS 0 path,
// if it has one, as often as its QoS 1 path).
func recs(n int) []*logstore.Record {
	out := make([]*logstore.Record, n)
	for i := range out {
		out[i] = rec(fmt.Sprintf("t/%d", i), 100)
		out[i].QoS = byte(1 - i%2)
	}
	return out
}

// readAll reads every committed record from from on.
func readAll(t *testing.T, s mqtt.Stream, from uint64) []*logstore.Record {
	t.Helper()
	var out []*logstore.Record
	for from < s.Committed() {
		got, err := s.Read(from, 0, 0)
		if err != nil {
			t.Fatalf("Read(%d): %v", from, err)
		}
		if len(got) == 0 {
			t.Fatalf("Read(%d) below Committed %d returned nothing", from, s.Committed())
		}
		out = append(out, got...)
		from += uint64(len(got))
	}
	return out
}

// checkOffsets fails unless got are the records at offsets from, from+1, ...
// with the topics of want.
func checkOffsets(t *testing.T, got []*logstore.Record, from uint64, want []*logstore.Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i, r := range got {
		if r.Offset != from+uint64(i) || r.Topic != want[i].Topic || string(r.Payload) != string(want[i].Payload) {
			t.Fatalf("record %d: offset %d topic %q, want offset %d topic %q (same payload)",
				i, r.Offset, r.Topic, from+uint64(i), want[i].Topic)
		}
	}
}

// wantErr fails unless err wraps target.
func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err %v, want one wrapping %v", what, err, target)
	}
}

// waitClosed waits for ch to close.
func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(Deadline):
		t.Fatalf("%s: Changed not closed within %v", what, Deadline)
	}
}

// isClosed reports whether ch is closed now.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
