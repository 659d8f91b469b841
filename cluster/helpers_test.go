package cluster

import (
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
)

// openStore opens a pi-zero store in dir (a fresh temporary one when dir
// is "") and closes it at cleanup unless the test closed it first.
func openStore(tb testing.TB, dir string) *logstore.Store {
	tb.Helper()
	if dir == "" {
		dir = tb.TempDir()
	}
	st, err := logstore.Open(logstore.Config{
		Dir:               dir,
		Profile:           logstore.ProfilePiZero,
		Streams:           []logstore.StreamConfig{{Name: "default", Filters: []string{"#"}}},
		RetentionInterval: time.Hour,
		MinFreeBytes:      -1,
	})
	if err != nil {
		tb.Fatalf("logstore.Open: %v", err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	return st
}
