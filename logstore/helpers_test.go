package logstore

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// testConfig is a pi-zero store in a fresh temporary directory with the
// given streams (one "default" capturing "#" when none are given).
func testConfig(tb testing.TB, streams ...StreamConfig) Config {
	tb.Helper()
	if len(streams) == 0 {
		streams = []StreamConfig{{Name: "default", Filters: []string{"#"}}}
	}
	return Config{
		Dir:               tb.TempDir(),
		Profile:           ProfilePiZero,
		Streams:           streams,
		RetentionInterval: time.Hour, // tests call ApplyRetention themselves
		MinFreeBytes:      -1,
	}
}

// openStore opens cfg and closes the store at cleanup.
func openStore(tb testing.TB, cfg Config) *Store {
	tb.Helper()
	st, err := Open(cfg)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() {
		if err := st.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return st
}

func rec(topic, payload string) *Record {
	return &Record{Topic: topic, Payload: []byte(payload), QoS: 1}
}

// appendN appends n records "topic/i" with payload "p<i>" in groups of
// per, and returns the offset of the first.
func appendN(tb testing.TB, s *Stream, n, per int) uint64 {
	tb.Helper()
	first := s.NextOffset()
	for i := 0; i < n; i += per {
		recs := make([]*Record, 0, per)
		for j := i; j < min(i+per, n); j++ {
			recs = append(recs, rec(fmt.Sprintf("t/%d", j), fmt.Sprintf("p%d", j)))
		}
		if _, err := s.Append(context.Background(), recs...); err != nil {
			tb.Fatalf("Append: %v", err)
		}
	}
	return first
}

// readAll reads [from, Committed()) in pages.
func readAll(tb testing.TB, s *Stream, from uint64) []*Record {
	tb.Helper()
	var out []*Record
	for from < s.Committed() {
		recs, err := s.Read(from, 500, 0)
		if err != nil {
			tb.Fatalf("Read(%d): %v", from, err)
		}
		if len(recs) == 0 {
			tb.Fatalf("Read(%d) returned nothing below Committed %d", from, s.Committed())
		}
		out = append(out, recs...)
		from = recs[len(recs)-1].Offset + 1
	}
	return out
}

// logCapture is a slog handler that keeps every record.
type logCapture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	return nil
}
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCapture) WithGroup(string) slog.Handler      { return l }

// count returns how many records at level contain msg.
func (l *logCapture) count(level slog.Level, msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Level == level && bytes.Contains([]byte(r.Message), []byte(msg)) {
			n++
		}
	}
	return n
}

// counterValue reads a Prometheus counter.
func counterValue(tb testing.TB, c prometheus.Counter) float64 {
	tb.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		tb.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
