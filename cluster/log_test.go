package cluster

import (
	"context"
	"log/slog"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
	"github.com/peatmq/peat/mqtt/mqtttest/logtest"
)

// logMaxAge is the streams' retention in the contract test: longer than
// any record's age (the suite stamps records in 2023), so only the suite's
// Expire drops records.
const logMaxAge = 100 * 365 * 24 * time.Hour

// logNode is one node of a site with everything Log needs.
type logNode struct {
	node  *Node
	store *logstore.Store
	srv   *Server
	rep   *Replicator
	log   *Log
}

// close closes the node's parts in order: Log, Replicator, Server, Node,
// store.
func (n *logNode) close() error {
	err := n.log.Close()
	n.rep.Close()
	_ = n.srv.Close()
	if cerr := n.node.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if cerr := n.store.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

// logStreams are the stream configurations of "name=filter[,filter]" specs.
func logStreams(tb testing.TB, specs []string) []logstore.StreamConfig {
	var out []logstore.StreamConfig
	for _, spec := range specs {
		name, filters, ok := strings.Cut(spec, "=")
		if !ok {
			tb.Fatalf("bad stream spec %q", spec)
		}
		out = append(out, logstore.StreamConfig{Name: name, Filters: strings.Split(filters, ","), MaxAge: logMaxAge})
	}
	return out
}

// openLogNode opens a node in dir: its store (ManualCommit) with specs'
// streams, Raft and Serf (bootstrapping alone when expect is 1, joining
// join otherwise), a Server, a Replicator and the Log.
func openLogNode(tb testing.TB, id, dir string, join []string, expect int, minFree int64, specs []string) *logNode {
	tb.Helper()
	st, err := logstore.Open(logstore.Config{
		Dir: dir + "/store", Profile: logstore.ProfilePiZero, Streams: logStreams(tb, specs),
		RetentionInterval: time.Hour, MinFreeBytes: minFree, ManualCommit: true,
	})
	if err != nil {
		tb.Fatalf("logstore.Open: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.NodeID, cfg.SerfAddr, cfg.RaftAddr, cfg.ClusterAddr = id, "127.0.0.1:0", "127.0.0.1:0", ln.Addr().String()
	cfg.Join, cfg.BootstrapExpect = join, expect
	cfg.SnapshotDir = dir + "/snapshots"
	cfg.MQTTAddr, cfg.Version = "127.0.0.1:1883", "test"
	node, err := Open(cfg, st)
	if err != nil {
		_ = st.Close()
		tb.Fatalf("Open %s: %v", id, err)
	}
	srv := Serve(ln, nil)
	srv.ServeNode(node)
	rep := StartReplicator(ReplicatorConfig{Node: node, Server: srv, Stream: st.Stream, FetchMaxWait: 200 * time.Millisecond})
	return &logNode{node: node, store: st, srv: srv, rep: rep, log: NewLog(node, st, rep, slog.New(slog.DiscardHandler))}
}

// createStreams has the controller create each stream of specs on
// replicas, and waits until n's Log shows it and, when n is to lead it,
// n leads it.
func createStreams(tb testing.TB, n *logNode, replicas []string, names ...string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range names {
		if err := n.node.Submit(ctx, CreateStream{Name: name, Replicas: replicas}); err != nil {
			tb.Fatalf("create %s: %v", name, err)
		}
	}
	for _, name := range names {
		eventually(tb, n.node.ID()+" serves "+name, func() bool {
			s, _ := n.log.Stream(name).(*stream)
			if s == nil {
				return false
			}
			return replicas[0] != n.node.ID() || s.leading() != nil
		})
	}
}

// openSoloLog is logtest's Open on a one-node site.
func openSoloLog(minFree int64) logtest.Open {
	return func(t *testing.T, dir string, specs ...string) (mqtt.Log, func() error) {
		t.Helper()
		n := openLogNode(t, "n1", dir, nil, 1, minFree, specs)
		var names []string
		for _, sc := range logStreams(t, specs) {
			names = append(names, sc.Name)
		}
		createStreams(t, n, []string{"n1"}, names...)
		logs[n.log] = n
		var closed bool
		return n.log, func() error {
			if closed {
				return nil
			}
			closed = true
			return n.close()
		}
	}
}

// logs finds a test Log's node (the suite's hooks get the Log only).
var logs = map[*Log]*logNode{}

// TestLog_Contract runs mqtt/log.go's contract against the Log of a
// one-node site: the node leads every stream, its ISR is itself.
func TestLog_Contract(t *testing.T) {
	logtest.TestLog(t, logtest.Suite{
		Open:     openSoloLog(-1),
		OpenFull: openSoloLog(math.MaxInt64),
		Reopen:   true,
		AddStream: func(t *testing.T, l mqtt.Log, spec string) {
			n := logs[l.(*Log)]
			sc := logStreams(t, []string{spec})[0]
			if _, err := n.store.AddStream(sc); err != nil {
				t.Fatalf("AddStream(%s): %v", spec, err)
			}
			createStreams(t, n, []string{"n1"}, sc.Name)
		},
		RemoveStream: func(t *testing.T, l mqtt.Log, name string) {
			n := logs[l.(*Log)]
			if err := n.store.RemoveStream(name); err != nil {
				t.Fatalf("RemoveStream(%s): %v", name, err)
			}
			eventually(t, name+" leaves the log", func() bool { return l.Stream(name) == nil })
		},
		Expire: func(t *testing.T, s mqtt.Stream, before time.Time) {
			if _, err := s.(*stream).st.ApplyRetention(context.Background(), before.Add(logMaxAge)); err != nil {
				t.Fatalf("ApplyRetention: %v", err)
			}
		},
	})
}
