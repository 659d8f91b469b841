package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/edge"
	"github.com/peatmq/peat/logstore"
)

// binPath is the example binary TestMain builds once, without -race even
// under go test -race: race-instrumented SQLite (transpiled C) made the
// kill test take 26 s instead of 4 s (re-executing the test binary as the
// example was tried).
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "peat-aggregate-example-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "peat-aggregate-example")
	build := exec.Command("go", "build", "-o", binPath, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the example: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// startNode runs a Peat node in process on a free loopback port.
func startNode(t testing.TB) string {
	t.Helper()
	cfg := edge.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.MQTT.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = ""
	cfg.Storage.Profile = string(logstore.ProfileServer)
	n, err := edge.New(cfg, nil)
	if err != nil {
		t.Fatalf("edge.New: %v", err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Errorf("close node: %v", err)
		}
	})
	return n.MQTTAddr().String()
}

// testRecord is one message the test publishes.
type testRecord struct{ topic, payload string }

// workload is n messages: numbers on sensors/<i>/temp, a few non-numbers
// there too, and some on a topic the example's filter does not match; and
// the aggregates of one clean pass over it. Values are multiples of 0.25 so
// float sums are exact in any grouping of the same order.
func workload(rng *rand.Rand, n int) ([]testRecord, map[string]Aggregate) {
	recs := make([]testRecord, n)
	want := make(map[string]Aggregate)
	for i := range recs {
		switch k := rng.IntN(100); {
		case k < 5:
			recs[i] = testRecord{"other/topic", "1"}
		case k < 6:
			recs[i] = testRecord{fmt.Sprintf("sensors/%d/temp", rng.IntN(5)), "n/a"}
		default:
			topic := fmt.Sprintf("sensors/%d/temp", rng.IntN(5))
			v := float64(rng.IntN(8001)-4000) / 4
			recs[i] = testRecord{topic, fmt.Sprint(v)}
			want[topic] = add(want[topic], v)
		}
	}
	return recs, want
}

// publish sends recs at QoS 1 from one MQTT 3.1.1 client, up to 100 in
// flight, and waits for every PUBACK.
func publish(addr string, recs []testRecord) error {
	c := mqtt3.NewClient(mqtt3.NewClientOptions().AddBroker("tcp://" + addr).
		SetClientID(fmt.Sprintf("pub-%d", rand.Int())).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		return fmt.Errorf("connect publisher: %v", tok.Error())
	}
	defer c.Disconnect(0)
	var window []mqtt3.Token
	for i, r := range recs {
		window = append(window, c.Publish(r.topic, 1, false, r.payload))
		if len(window) == 100 || i == len(recs)-1 {
			for _, tok := range window {
				if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
					return fmt.Errorf("publish: %v", tok.Error())
				}
			}
			window = window[:0]
		}
	}
	return nil
}

// consumer is one run of the example process.
type consumer struct {
	cmd    *exec.Cmd
	done   chan struct{}
	stderr bytes.Buffer // written by exec's copier until done
}

func startConsumer(t testing.TB, addr, db string) *consumer {
	t.Helper()
	c := &consumer{done: make(chan struct{})}
	c.cmd = exec.Command(binPath, "--broker", addr, "--db", db, "sensors/#")
	c.cmd.Stderr = &c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start the example: %v", err)
	}
	go func() { _ = c.cmd.Wait(); close(c.done) }() // owned by this consumer
	t.Cleanup(func() { _ = c.cmd.Process.Kill(); <-c.done })
	return c
}

// applied reads how many records the example has aggregated so far (its
// database may not exist yet: 0).
func applied(t testing.TB, db *sql.DB) int64 {
	t.Helper()
	var n sql.NullInt64
	if err := db.QueryRow(`SELECT SUM(count) FROM aggregates`).Scan(&n); err != nil {
		return 0 // not created yet
	}
	return n.Int64
}

// TestExample_ExactlyOnceAcrossKills runs the example as a process, kills
// it with SIGKILL at random points while records are replayed and while
// new ones are published, restarts it each time, and checks that its
// aggregates equal a single clean pass: nothing counted twice, nothing
// missed, with no state in the broker.
func TestExample_ExactlyOnceAcrossKills(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	addr := startNode(t)
	recs, want := workload(rng, 5000)
	var numeric int64
	for _, a := range want {
		numeric += a.Count
	}
	history, live := recs[:4000], recs[4000:]
	if err := publish(addr, history); err != nil {
		t.Fatal(err)
	}

	dbPath := filepath.Join(t.TempDir(), "agg.db")
	// The test's own reading connection; the example may create the file.
	reader, err := sql.Open("sqlite", dbPath+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()

	var wg sync.WaitGroup
	pubErr := make(chan error, 1)
	wg.Add(1)
	go func() { // publishes the live part while the consumer is being killed
		defer wg.Done()
		time.Sleep(100 * time.Millisecond)
		pubErr <- publish(addr, live)
	}()

	const kills = 5
	var killedAt []int64
	for i := range kills {
		c := startConsumer(t, addr, dbPath)
		// Kill at a random point of this run's share of the stream.
		target := numeric * int64(i+1) / (kills + 1)
		target += rng.Int64N(numeric/(kills+1)) - numeric/(2*(kills+1))
		deadline := time.Now().Add(20 * time.Second)
		for applied(t, reader) < target && time.Now().Before(deadline) {
			select {
			case <-c.done:
				t.Fatalf("run %d exited before it was killed: %v\n%s", i, c.cmd.ProcessState, c.stderr.String())
			case <-time.After(time.Duration(rng.IntN(3000)) * time.Microsecond):
			}
		}
		if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-c.done
		killedAt = append(killedAt, applied(t, reader))
	}
	wg.Wait()
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	t.Logf("killed after %v of %d records", killedAt, numeric)
	if killedAt[0] == 0 || killedAt[kills-1] >= numeric {
		t.Errorf("kills at %v: want the first after some records and the last before all %d", killedAt, numeric)
	}

	c := startConsumer(t, addr, dbPath)
	deadline := time.Now().Add(30 * time.Second)
	for applied(t, reader) < numeric && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	<-c.done
	if !c.cmd.ProcessState.Success() {
		t.Errorf("interrupted example exited with %v\n%s", c.cmd.ProcessState, c.stderr.String())
	}

	store, err := OpenStore(dbPath, "sensors/#")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if got := aggregates(t, store); !reflect.DeepEqual(got, want) {
		t.Errorf("aggregates after %d kills differ from one clean pass:\n got %v\nwant %v\nlast run's log:\n%s", kills, got, want, c.stderr.String())
	}
}
