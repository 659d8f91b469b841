package mqtttest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/logtest"
)

// memLog makes a MemLog an mqtt.Log, as edge/storelog.go does for the
// Badger-backed store.
type memLog struct{ l *mqtttest.MemLog }

var (
	_ mqtt.Log        = memLog{}
	_ mqtt.Stream     = (*mqtttest.MemStream)(nil)
	_ mqtt.StateStore = (*mqtttest.MemState)(nil)
)

func (l memLog) Route(topic string) mqtt.Stream {
	if s := l.l.Route(topic); s != nil {
		return s
	}
	return nil
}

func (l memLog) Streams() []mqtt.Stream {
	var out []mqtt.Stream
	for _, s := range l.l.Streams() {
		out = append(out, s)
	}
	return out
}

func (l memLog) State() mqtt.StateStore { return l.l.State() }

func (l memLog) Stream(name string) mqtt.Stream {
	if s := l.l.Lookup(name); s != nil {
		return s
	}
	return nil
}

func (l memLog) WatchStreams() (<-chan mqtt.StreamEvent, func()) {
	in, cancel := l.l.Watch()
	return mqtt.ForwardStreamEvents(in, cancel, func(ev mqtttest.MemEvent) mqtt.StreamEvent {
		return mqtt.StreamEvent{Kind: ev.Kind, Stream: ev.Stream}
	})
}

// TestMemLog_Contract runs the contract of mqtt/log.go against MemLog, so
// the mqtt tests built on it are not fooled by it. A MemLog keeps nothing
// across a reopen; its Trim stands in for retention.
func TestMemLog_Contract(t *testing.T) {
	logtest.TestLog(t, logtest.Suite{
		Open: func(t *testing.T, _ string, specs ...string) (mqtt.Log, func() error) {
			l := mqtttest.NewMemLog(t, specs...)
			return memLog{l}, func() error { l.Close(); return nil }
		},
		OpenFull: func(t *testing.T, _ string, specs ...string) (mqtt.Log, func() error) {
			l := mqtttest.NewMemLog(t, specs...)
			for _, s := range l.Streams() {
				s.Fail(logstore.ErrNoSpace)
			}
			return memLog{l}, func() error { l.Close(); return nil }
		},
		AddStream: func(t *testing.T, l mqtt.Log, spec string) {
			if _, err := l.(memLog).l.AddStream(spec); err != nil {
				t.Fatalf("AddStream(%s): %v", spec, err)
			}
		},
		RemoveStream: func(t *testing.T, l mqtt.Log, name string) {
			if err := l.(memLog).l.RemoveStream(name); err != nil {
				t.Fatalf("RemoveStream(%s): %v", name, err)
			}
		},
		Expire: func(t *testing.T, s mqtt.Stream, before time.Time) {
			off, err := s.OffsetForTime(before)
			if err != nil {
				t.Fatalf("OffsetForTime: %v", err)
			}
			s.(*mqtttest.MemStream).Trim(off)
		},
	})
}

// TestMemStream_Steering checks what tests steer beyond the contract: held
// appends wait, Fail refuses, Trim drops.
func TestMemStream_Steering(t *testing.T) {
	s := mqtttest.NewMemLog(t, "a=#").Stream(t, "a")
	ch := s.Changed()
	s.Hold()
	type res struct {
		first uint64
		err   error
	}
	results := make(chan res, 3)
	for range 3 {
		s.AppendAsync([]*logstore.Record{{Topic: "x"}, {Topic: "y"}}, func(first uint64, err error) {
			results <- res{first, err}
		})
	}
	s.WaitAppends(t, 3)
	if s.Submitted() != 3 {
		t.Fatalf("Submitted %d, want 3", s.Submitted())
	}
	select {
	case <-ch:
		t.Fatal("Changed closed while appends are held")
	default:
	}
	if got := s.Committed(); got != 0 {
		t.Fatalf("Committed while held = %d, want 0", got)
	}
	s.Release()
	for i := range 3 {
		r := <-results
		if r.err != nil || r.first != uint64(2*i) {
			t.Fatalf("append %d: first %d err %v, want %d nil", i, r.first, r.err, 2*i)
		}
	}
	if got := s.WaitRecords(t, 6); len(got) != 6 {
		t.Fatalf("WaitRecords = %d records, want 6", len(got))
	}

	full := errors.New("disk full")
	s.Fail(full)
	s.AppendAsync([]*logstore.Record{{Topic: "z"}}, func(first uint64, err error) { results <- res{first, err} })
	if r := <-results; !errors.Is(r.err, full) {
		t.Fatalf("append while failing: err %v, want %v", r.err, full)
	}
	s.Fail(nil)
	s.AppendAsync([]*logstore.Record{{Topic: "z"}}, func(first uint64, err error) { results <- res{first, err} })
	if r := <-results; r.err != nil || r.first != 6 {
		t.Fatalf("append after healing: first %d err %v, want 6 nil", r.first, r.err)
	}

	ch = s.Changed()
	s.Trim(2)
	if !isClosed(ch) {
		t.Fatal("Trim did not close Changed")
	}
	if s.FirstOffset() != 2 || len(s.Records()) != 5 {
		t.Fatalf("after Trim(2): FirstOffset %d, %d records; want 2, 5", s.FirstOffset(), len(s.Records()))
	}
	if _, err := s.Read(1, 10, 0); !errors.Is(err, logstore.ErrOffsetOutOfRange) {
		t.Fatalf("Read below first: err %v, want out of range", err)
	}
}

// TestMemLog_HeldAppendsFailAtClose: appends held at close fail with
// ErrClosed.
func TestMemLog_HeldAppendsFailAtClose(t *testing.T) {
	l := mqtttest.NewMemLog(t, "a=#")
	s := l.Stream(t, "a")
	s.Hold()
	errs := make(chan error, 1)
	s.AppendAsync([]*logstore.Record{{Topic: "x"}}, func(_ uint64, err error) { errs <- err })
	s.WaitAppends(t, 1)
	l.Close()
	if err := <-errs; !errors.Is(err, logstore.ErrClosed) {
		t.Fatalf("held append at close: err %v, want ErrClosed", err)
	}
	if len(s.Records()) != 0 {
		t.Fatal("a held append was committed at close")
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
