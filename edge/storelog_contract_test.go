package edge

import (
	"context"
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
// gives the MQTT front-end: the Badger-backed logstore behind storeLog.
func TestStoreLog_Contract(t *testing.T) {
	logtest.TestLog(t, logtest.Suite{
		Open:   openContractStore,
		Reopen: true,
		Expire: func(t *testing.T, s mqtt.Stream, before time.Time) {
			// Retention at before+MaxAge drops what is older than before.
			if _, err := s.(*logstore.Stream).ApplyRetention(context.Background(), before.Add(contractMaxAge)); err != nil {
				t.Fatalf("ApplyRetention: %v", err)
			}
		},
	})
}

func openContractStore(t *testing.T, dir string, specs ...string) (mqtt.Log, func() error) {
	t.Helper()
	cfg := logstore.Config{
		Dir:               dir,
		Profile:           logstore.ProfilePiZero,
		RetentionInterval: time.Hour, // the suite applies retention itself
		MinFreeBytes:      -1,
	}
	for _, spec := range specs {
		name, filters, ok := strings.Cut(spec, "=")
		if !ok {
			t.Fatalf("bad stream spec %q", spec)
		}
		cfg.Streams = append(cfg.Streams, logstore.StreamConfig{
			Name: name, Filters: strings.Split(filters, ","), MaxAge: contractMaxAge,
		})
	}
	st, err := logstore.Open(cfg)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	return storeLog{st}, st.Close
}
