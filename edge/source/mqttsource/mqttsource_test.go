package mqttsource_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/edge/sink/sinktest"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/source/mqttsource"
	"github.com/peatmq/peat/edge/source/sourcetest"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// run is one source running into a stream.
type run struct {
	src    *source.Source
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *run) stop() {
	r.cancel()
	<-r.done
}

// startSource runs a source named "cloud" of cfg into log's stream.
func startSource(t *testing.T, log source.Log, stream string, marks source.Positions, cfg mqttsource.Config) *run {
	t.Helper()
	up, err := mqttsource.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src, err := source.New(source.Config{
		Name: "cloud", Kind: "mqtt", Stream: stream, Log: log, Upstream: up, Marks: marks,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, StallAfter: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{src: src, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		src.Run(ctx)
	}()
	t.Cleanup(r.stop)
	return r
}

func waitState(t *testing.T, r *run, want source.State) {
	t.Helper()
	sinktest.WaitFor(t, "source "+string(want), 30*time.Second, func() bool { return r.src.Status().State == want })
}

// publisher is an MQTT 3.1.1 client publishing upstream.
type publisher struct{ c paho.Client }

func newPublisher(t *testing.T, addr, id string) *publisher {
	t.Helper()
	opts := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetCleanSession(true).
		SetAutoReconnect(false).SetOrderMatters(true)
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("publisher connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return &publisher{c: c}
}

// publish sends n messages "prefix-i" on topic with qos, each waiting
// for its acknowledgement.
func (p *publisher) publish(t *testing.T, topic string, qos byte, prefix string, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		tok := p.c.Publish(topic, qos, false, fmt.Sprintf("%s-%d", prefix, i))
		if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %d: %v", i, tok.Error())
		}
	}
}

// counts are the stream's payloads and how often each is there.
func counts(s *mqtttest.MemStream) map[string]int {
	m := map[string]int{}
	for _, r := range s.Records() {
		m[string(r.Payload)]++
	}
	return m
}

// waitPayloads waits until every "prefix-i", i < n, is in s.
func waitPayloads(t *testing.T, s *mqtttest.MemStream, prefix string, n int) map[string]int {
	t.Helper()
	var c map[string]int
	sinktest.WaitFor(t, fmt.Sprintf("%d messages in the log", n), 60*time.Second, func() bool {
		c = counts(s)
		for i := range n {
			if c[fmt.Sprintf("%s-%d", prefix, i)] == 0 {
				return false
			}
		}
		return true
	})
	return c
}

func TestSource_StoresUpstreamMessagesUnderTheirMappedTopic(t *testing.T) {
	addr := sinktest.StartMosquitto(t)
	log := mqtttest.NewMemLog(t, "default=#")
	st := log.Lookup("default")
	r := startSource(t, sourcetest.MemLog{L: log}, "default", &sourcetest.Marks{}, mqttsource.Config{
		URL: "mqtt://" + addr, ClientID: "site-a-down", Version: 5,
		Subscribe: []mqttsource.Subscription{{Filter: "site-a/cmd/#", QoS: 1}}, Strip: "site-a/",
	})
	waitState(t, r, source.StateConnected)
	// mosquitto_pub: MQTT 5 properties and the retain flag, as a cloud
	// application sends them.
	out, err := exec.Command("mosquitto_pub", "-h", "127.0.0.1", "-p", portOf(addr), "-V", "5", "-q", "1", "-r",
		"-t", "site-a/cmd/dev1", "-m", "reboot",
		"-D", "publish", "user-property", "who", "ops",
		"-D", "publish", "content-type", "text/plain",
		"-D", "publish", "response-topic", "site-a/reply/dev1",
		"-D", "publish", "correlation-data", "c-17").CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_pub: %v %s", err, out)
	}
	recs := st.WaitRecords(t, 1)
	got := recs[0]
	if got.Topic != "cmd/dev1" || string(got.Payload) != "reboot" || got.QoS != 1 || !got.Retain {
		t.Fatalf("record %q %q qos %d retain %v, want cmd/dev1 reboot qos 1 retained", got.Topic, got.Payload, got.QoS, got.Retain)
	}
	if got.ContentType != "text/plain" || got.ResponseTopic != "site-a/reply/dev1" || string(got.CorrelationData) != "c-17" {
		t.Errorf("properties: content type %q, response topic %q, correlation %q", got.ContentType, got.ResponseTopic, got.CorrelationData)
	}
	props := map[string]string{}
	for _, p := range got.UserProperties {
		props[p.Key] = p.Value
	}
	if props["who"] != "ops" || props[source.PropSource] != "cloud" || props[source.PropOrigin] != "mqtt://"+addr {
		t.Errorf("user properties %v: want who=ops, %s=cloud, %s=mqtt://%s", got.UserProperties, source.PropSource, source.PropOrigin, addr)
	}
	sinktest.WaitFor(t, "the acknowledgement", 10*time.Second, func() bool { return r.src.Status().Pending == 0 })
	if s := r.src.Status(); s.Received != 1 || s.Pending != 0 || s.LastReceived == nil || s.LastDurable == nil {
		t.Errorf("status %+v: want 1 received, 1 appended, times set", s)
	}
}

func portOf(addr string) string {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[i+1:]
		}
	}
	return addr
}

// TestSource_AcknowledgesOnlyWhatIsDurable: messages whose appends never
// commit are not acknowledged, so the upstream keeps them in the session
// and gives them to the next run (a crash of a node loses nothing).
func TestSource_AcknowledgesOnlyWhatIsDurable(t *testing.T) {
	for _, qos := range []byte{1, 2} {
		t.Run("qos"+strconv.Itoa(int(qos)), func(t *testing.T) {
			addr := sinktest.StartMosquitto(t)
			cfg := mqttsource.Config{URL: "mqtt://" + addr, ClientID: "down", Version: 5,
				Subscribe: []mqttsource.Subscription{{Filter: "cmd/#", QoS: qos}}}
			log1 := mqtttest.NewMemLog(t, "default=#")
			log1.Lookup("default").Hold() // nothing commits
			marks := &sourcetest.Marks{}
			r1 := startSource(t, sourcetest.MemLog{L: log1}, "default", marks, cfg)
			waitState(t, r1, source.StateConnected)
			pub := newPublisher(t, addr, "app")
			pub.publish(t, "cmd/x", qos, "m", 0, 5)
			sinktest.WaitFor(t, "5 pending", 30*time.Second, func() bool { return r1.src.Status().Pending == 5 })
			// Nothing durable for stall_after (2s here): stalled, connected
			// as it is.
			waitState(t, r1, source.StateStalled)
			log1.Close() // the held appends fail: the node died before they were durable
			r1.stop()

			log2 := mqtttest.NewMemLog(t, "default=#")
			startSource(t, sourcetest.MemLog{L: log2}, "default", marks, cfg)
			c := waitPayloads(t, log2.Lookup("default"), "m", 5)
			if len(c) != 5 {
				t.Errorf("log holds %v, want m-0..m-4", c)
			}
		})
	}
}

// failOnce is a stream whose first append commits and then reports a
// failure, as a node that stored a batch and died before its
// acknowledgement went upstream.
type failOnce struct {
	*mqtttest.MemStream
	failed atomic.Bool
}

func (s *failOnce) AppendAsync(recs []*logstore.Record, done func(uint64, error)) {
	s.MemStream.AppendAsync(recs, func(first uint64, err error) {
		if err == nil && s.failed.CompareAndSwap(false, true) {
			err = errors.New("lost the acknowledgement")
		}
		done(first, err)
	})
}

type failLog struct {
	sourcetest.MemLog
	st *failOnce
}

func (l failLog) Stream(string) source.Stream { return l.st }

// TestSource_QoS2RedeliveryOfAStoredMessageIsNotStoredAgain: a QoS 2
// message stored here whose PUBREC never went out comes again (DUP)
// on the next connection; the source recognises its packet id in the log
// and only acknowledges it. A QoS 1 message in the same place is stored
// twice (at least once).
func TestSource_QoS2RedeliveryOfAStoredMessageIsNotStoredAgain(t *testing.T) {
	for _, tc := range []struct {
		qos  byte
		want int
	}{{2, 1}, {1, 2}} {
		t.Run("qos"+strconv.Itoa(int(tc.qos)), func(t *testing.T) {
			addr := sinktest.StartMosquitto(t)
			log := mqtttest.NewMemLog(t, "default=#")
			st := &failOnce{MemStream: log.Lookup("default")}
			r := startSource(t, failLog{sourcetest.MemLog{L: log}, st}, "default", &sourcetest.Marks{}, mqttsource.Config{
				URL: "mqtt://" + addr, ClientID: "down", Version: 5,
				Subscribe: []mqttsource.Subscription{{Filter: "cmd/#", QoS: tc.qos}}})
			waitState(t, r, source.StateConnected)
			pub := newPublisher(t, addr, "app")
			pub.publish(t, "cmd/x", tc.qos, "m", 0, 1)
			sinktest.WaitFor(t, "the redelivery", 30*time.Second, func() bool {
				s := r.src.Status()
				return s.Reconnects >= 1 && s.Pending == 0 && (s.Duplicates+s.Appended) >= 1
			})
			pub.publish(t, "cmd/x", tc.qos, "m", 1, 1)
			waitPayloads(t, st.MemStream, "m", 2)
			c := counts(st.MemStream)
			if c["m-0"] != tc.want || c["m-1"] != 1 {
				t.Fatalf("log holds %v, want m-0 %d times and m-1 once", c, tc.want)
			}
			if tc.qos == 2 {
				if d := r.src.Status().Duplicates; d != 1 {
					t.Errorf("%d duplicates counted, want 1", d)
				}
			}
		})
	}
}

// TestSource_ThroughFaults: a real mosquitto behind a proxy that resets
// connections, black-holes them and delays them, while an application
// publishes upstream. QoS 2: every message is in the log exactly once.
// QoS 1: every message at least once, and at most one window (the
// Receive Maximum) again per lost connection: what was stored and
// acknowledged as the connection went.
func TestSource_ThroughFaults(t *testing.T) {
	sinktest.RequireReceiveMaximum(t)
	const window = 20
	for _, qos := range []byte{2, 1} {
		t.Run("qos"+strconv.Itoa(int(qos)), func(t *testing.T) {
			addr := sinktest.StartMosquitto(t)
			proxy := sinktest.NewProxy(t, addr, 30*time.Millisecond)
			log := mqtttest.NewMemLog(t, "default=#")
			st := log.Lookup("default")
			r := startSource(t, sourcetest.MemLog{L: log}, "default", &sourcetest.Marks{}, mqttsource.Config{
				URL: "mqtt://" + proxy.Addr(), ClientID: "down", Version: 5, Keepalive: 2 * time.Second,
				ReceiveMaximum: window,
				Subscribe:      []mqttsource.Subscription{{Filter: "cmd/#", QoS: qos}}})
			waitState(t, r, source.StateConnected)
			const n = 1500
			pub := newPublisher(t, addr, "app")
			var wg sync.WaitGroup
			wg.Go(func() { pub.publish(t, "cmd/x", qos, "m", 0, n) })

			for i, mode := range []int32{sinktest.ModeReset, sinktest.ModeBlackHole, sinktest.ModeDelay, sinktest.ModeReset} {
				sinktest.WaitFor(t, "progress", 60*time.Second, func() bool { return st.Committed() > uint64(100*(i+1)) })
				proxy.SetMode(mode)
				if mode == sinktest.ModeBlackHole {
					// The keepalive finds the black hole: the source
					// reconnects (and cannot, while it lasts).
					waitState(t, r, source.StateConnecting)
				} else {
					time.Sleep(300 * time.Millisecond)
				}
				proxy.SetMode(sinktest.ModePass)
			}
			wg.Wait()
			c := waitPayloads(t, st, "m", n)
			repeats := 0
			for p, k := range c {
				if k > 1 {
					repeats += k - 1
					if qos == 2 {
						t.Errorf("%s is in the log %d times", p, k)
					}
				}
			}
			s := r.src.Status()
			t.Logf("qos %d: %d records for %d messages, %d reconnects, %d redeliveries recognised", qos, len(st.Records()), n, s.Reconnects, s.Duplicates)
			if qos == 1 && repeats > int(s.Reconnects)*window {
				t.Errorf("%d repeats after %d reconnects, want at most a window (%d) per reconnect", repeats, s.Reconnects, window)
			}
		})
	}
}

func TestSource_PauseDisconnectsAndResumeBringsWhatCameMeanwhile(t *testing.T) {
	addr := sinktest.StartMosquitto(t)
	log := mqtttest.NewMemLog(t, "default=#")
	st := log.Lookup("default")
	r := startSource(t, sourcetest.MemLog{L: log}, "default", &sourcetest.Marks{}, mqttsource.Config{
		URL: "mqtt://" + addr, ClientID: "down", Version: 4,
		Subscribe: []mqttsource.Subscription{{Filter: "cmd/#", QoS: 1}}})
	waitState(t, r, source.StateConnected)
	r.src.Pause()
	waitState(t, r, source.StatePaused)
	pub := newPublisher(t, addr, "app")
	pub.publish(t, "cmd/x", 1, "m", 0, 3)
	time.Sleep(200 * time.Millisecond)
	if n := len(st.Records()); n != 0 {
		t.Fatalf("%d records while paused", n)
	}
	r.src.Resume()
	waitPayloads(t, st, "m", 3)
	waitState(t, r, source.StateConnected)
}

// TestSource_DropsWhatItsStreamDoesNotCapture: a mapped topic another
// stream captures is counted and acknowledged, and the source goes on.
func TestSource_DropsWhatItsStreamDoesNotCapture(t *testing.T) {
	addr := sinktest.StartMosquitto(t)
	log := mqtttest.NewMemLog(t, "cmd=cmd/#", "other=#")
	st := log.Lookup("cmd")
	r := startSource(t, sourcetest.MemLog{L: log}, "cmd", &sourcetest.Marks{}, mqttsource.Config{
		URL: "mqtt://" + addr, ClientID: "down", Version: 5,
		Subscribe: []mqttsource.Subscription{{Filter: "up/#", QoS: 1}}, Strip: "up/"})
	waitState(t, r, source.StateConnected)
	pub := newPublisher(t, addr, "app")
	pub.publish(t, "up/telemetry/x", 1, "t", 0, 1)
	pub.publish(t, "up/cmd/x", 1, "m", 0, 1)
	waitPayloads(t, st, "m", 1)
	if s := r.src.Status(); s.Dropped != 1 || len(log.Lookup("other").Records()) != 0 {
		t.Fatalf("status %+v, other stream %d records: want 1 dropped, none stored", s, len(log.Lookup("other").Records()))
	}
}
