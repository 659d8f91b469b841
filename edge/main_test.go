package edge

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the package when goroutines of the node (edge, mqtt,
// logstore, mochi, Badger, the HTTP server) outlive the tests: every Close
// must stop and wait for what it started.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := leakedGoroutines(10 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines still running after every node was closed:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// leakedGoroutines waits up to grace for the node's goroutines to end and
// returns the stacks of those that did not.
func leakedGoroutines(grace time.Duration) string {
	suspect := []string{"peatmq/peat/", "dgraph-io/badger", "mochi-mqtt/server", "net/http.(*Server)", "net/http.(*conn)"}
	deadline := time.Now().Add(grace)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "edge.TestMain") || strings.Contains(g, "edge.leakedGoroutines") {
				continue
			}
			for _, s := range suspect {
				if strings.Contains(g, s) {
					leaked = append(leaked, g)
					break
				}
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
