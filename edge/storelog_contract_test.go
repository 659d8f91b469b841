package edge

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
	"github.com/peatmq/peat/mqtt/mqtttest/logtest"
)

// contractMaxAge is the streams' retention in the contract test: longer
// than any record's age (the suite stamps records in 2023), so only the
// suite's Expire drops records.
const contractMaxAge = 100 * 365 * 24 * time.Hour

// TestStoreLog_Contract runs the contract of mqtt/log.go against what a node
// gives the MQTT front-end: the Badger-backed logstore behind storeLog. It
// runs once per appender path: fsync group commits, and interval
// durability with lingering commits (where a QoS 0 append may wait for the
// appender rather than wake it).
func TestStoreLog_Contract(t *testing.T) {
	for _, tc := range []struct {
		name string
		sc   logstore.StreamConfig
	}{
		{"fsync", logstore.StreamConfig{Durability: logstore.DurabilityFsync}},
		{"interval-linger", logstore.StreamConfig{
			Durability: logstore.DurabilityInterval, SyncInterval: 10 * time.Millisecond,
			Linger: 2 * time.Millisecond, LingerQoS0: 5 * time.Millisecond,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logtest.TestLog(t, logtest.Suite{
				Open:     contractStore(tc.sc, -1),
				OpenFull: contractStore(tc.sc, math.MaxInt64), // no disk has that much free
				Reopen:   true,
				AddStream: func(t *testing.T, l mqtt.Log, spec string) {
					name, filters, _ := strings.Cut(spec, "=")
					s := tc.sc
					s.Name, s.Filters = name, strings.Split(filters, ",")
					if _, err := l.(storeLog).s.AddStream(s); err != nil {
						t.Fatalf("AddStream(%s): %v", spec, err)
					}
				},
				RemoveStream: func(t *testing.T, l mqtt.Log, name string) {
					if err := l.(storeLog).s.RemoveStream(name); err != nil {
						t.Fatalf("RemoveStream(%s): %v", name, err)
					}
				},
				Expire: func(t *testing.T, s mqtt.Stream, before time.Time) {
					// Retention at before+MaxAge drops what is older than before.
					if _, err := s.(*logstore.Stream).ApplyRetention(context.Background(), before.Add(contractMaxAge)); err != nil {
						t.Fatalf("ApplyRetention: %v", err)
					}
				},
			})
		})
	}
}

// contractStore opens stores whose streams are like sc, with the suite's
// names and filters, and minFree as MinFreeBytes.
func contractStore(sc logstore.StreamConfig, minFree int64) logtest.Open {
	return func(t *testing.T, dir string, specs ...string) (mqtt.Log, func() error) {
		t.Helper()
		cfg := logstore.Config{
			Dir:               dir,
			Profile:           logstore.ProfilePiZero,
			RetentionInterval: time.Hour, // the suite applies retention itself
			MinFreeBytes:      minFree,
		}
		for _, spec := range specs {
			name, filters, ok := strings.Cut(spec, "=")
			if !ok {
				t.Fatalf("bad stream spec %q", spec)
			}
			s := sc
			s.Name, s.Filters, s.MaxAge = name, strings.Split(filters, ","), contractMaxAge
			cfg.Streams = append(cfg.Streams, s)
		}
		st, err := logstore.Open(cfg)
		if err != nil {
			t.Fatalf("open store: %v", err)
		}
		return storeLog{st}, st.Close
	}
}
