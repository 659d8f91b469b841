package edge

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	pahov5 "github.com/eclipse/paho.golang/paho"
)

// mosquittoSub starts Debian's mosquitto_sub with args against the node and
// returns its output lines as they come, and a wait for its exit that
// returns what it wrote to stderr. scripts/test-deps.sh installs it.
func mosquittoSub(tb testing.TB, n *Node, args ...string) (lines <-chan string, wait func() (string, error)) {
	tb.Helper()
	path, err := exec.LookPath("mosquitto_sub")
	if err != nil {
		tb.Fatalf("mosquitto_sub not found (Debian: apt-get install mosquitto-clients; make test-deps installs it): %v", err)
	}
	host, port, _ := net.SplitHostPort(n.MQTTAddr().String())
	cmd := exec.Command(path, append([]string{"-h", host, "-p", port}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	ch := make(chan string, 1024)
	exited := make(chan struct{})
	var waitErr error
	go func() { // the only caller of cmd.Wait
		defer close(exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch <- sc.Text()
		}
		close(ch)
		if err := cmd.Wait(); err != nil {
			waitErr = fmt.Errorf("mosquitto_sub %v: %w: %s", args, err, stderr.String())
		}
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range ch { // unblock the scanner if nobody read the rest
		}
		<-exited
	})
	return ch, func() (string, error) {
		<-exited
		return stderr.String(), waitErr
	}
}

// nextLine returns the next line, failing after a generous limit.
func nextLine(tb testing.TB, lines <-chan string) string {
	tb.Helper()
	select {
	case l, ok := <-lines:
		if !ok {
			tb.Fatal("mosquitto_sub exited")
		}
		return l
	case <-time.After(30 * time.Second):
		tb.Fatal("no line from mosquitto_sub in 30 s")
	}
	return ""
}

// The first promise: mosquitto_sub on $replay/earliest/+/sensors/#
// against a broker with stored messages prints them with their offsets in
// the topic, then keeps printing new ones. MQTT 3.1.1 and 5.
func TestNode_MosquittoSubReplaysThenFollows(t *testing.T) {
	n := startNode(t, testConfig(t))
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 20)
	for _, version := range []string{"mqttv311", "mqttv5"} {
		t.Run(version, func(t *testing.T) {
			lines, _ := mosquittoSub(t, n, "-V", version, "-q", "1", "-v", "-t", "$replay/earliest/+/sensors/#")
			for i := range 20 {
				if got, want := nextLine(t, lines), fmt.Sprintf("$replay/earliest/%d/sensors/a m%d", i, i); got != want {
					t.Fatalf("line %d: %q, want %q", i, got, want)
				}
			}
		})
	}
	// One subscriber stays on while new messages come: it prints them.
	lines, _ := mosquittoSub(t, n, "-V", "mqttv5", "-q", "1", "-v", "-t", "$replay/-1h/+/sensors/#")
	for range 20 {
		nextLine(t, lines)
	}
	publishQoS1(t, n.MQTTAddr(), "sensors/b", 3)
	for i := range 3 {
		if got, want := nextLine(t, lines), fmt.Sprintf("$replay/-1h/%d/sensors/b m%d", 20+i, i); got != want {
			t.Fatalf("live line %d: %q, want %q", i, got, want)
		}
	}
}

// A refused extension subscription is not silent: mosquitto_sub reports it.
func TestNode_MosquittoSubSeesARefusal(t *testing.T) {
	n := startNode(t, testConfig(t))
	for _, version := range []string{"mqttv311", "mqttv5"} {
		lines, wait := mosquittoSub(t, n, "-V", version, "-q", "1", "-v", "-t", "$replay/yesterday/+/sensors/#")
		for l := range lines {
			t.Errorf("%s: printed %q", version, l)
		}
		if stderr, _ := wait(); !strings.Contains(stderr, "All subscription requests were denied") {
			t.Errorf("%s: mosquitto_sub said %q, want that the subscription was denied", version, stderr)
		}
	}
}

// A QoS 1 group consumer (mosquitto_sub, then paho) that goes away and
// comes back continues from what it acknowledged: no offset is skipped, and
// repeats are at most one window.
func TestNode_GroupConsumersResume(t *testing.T) {
	cfg := testConfig(t)
	n := startNode(t, cfg)
	const total = 100
	publishQoS1(t, n.MQTTAddr(), "sensors/a", total)
	seen := map[int]int{}
	note := func(topic string) {
		parts := strings.SplitN(topic, "/", 4)
		off, err := strconv.Atoi(parts[2])
		if err != nil || parts[0] != "$group" || parts[1] != "billing" || parts[3] != "sensors/a" {
			t.Fatalf("delivered topic %q", topic)
		}
		seen[off]++
	}

	// mosquitto_sub takes 30 and exits (-C), acknowledging what it printed.
	lines, wait := mosquittoSub(t, n, "-q", "1", "-v", "-C", "30", "-t", "$group/billing/+/sensors/#")
	for l := range lines {
		topic, _, _ := strings.Cut(l, " ")
		note(topic)
	}
	if _, err := wait(); err != nil {
		t.Fatal(err)
	}

	// paho (MQTT 5, Receive Maximum 10) takes over from the committed offset.
	conn, err := net.Dial("tcp", n.MQTTAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, total)
	c := pahov5.NewClient(pahov5.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(pahov5.PublishReceived) (bool, error){func(p pahov5.PublishReceived) (bool, error) {
			got <- p.Packet.Topic
			return true, nil
		}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rm := uint16(10)
	if _, err := c.Connect(ctx, &pahov5.Connect{ClientID: "paho-worker", CleanStart: true, KeepAlive: 30,
		Properties: &pahov5.ConnectProperties{ReceiveMaximum: &rm}}); err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(&pahov5.Disconnect{})
	// mosquitto_sub has exited, but the broker may not have seen its
	// connection close yet: until it has, the group still has a consumer
	// and a subscription is refused with 0x83 (README, "Consumer groups").
	// A consumer retries, as this one does.
	for {
		sa, err := c.Subscribe(ctx, &pahov5.Subscribe{Subscriptions: []pahov5.SubscribeOptions{
			{Topic: "$group/billing/+/sensors/#", QoS: 1}}})
		if err == nil {
			break
		}
		if sa == nil || len(sa.Reasons) != 1 || sa.Reasons[0] != 0x83 || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for len(seen) < total {
		select {
		case topic := <-got:
			note(topic)
		case <-ctx.Done():
			t.Fatalf("got %d of %d offsets", len(seen), total)
		}
	}
	repeats := 0
	for off := range total {
		if seen[off] == 0 {
			t.Fatalf("offset %d never delivered", off)
		}
		repeats += seen[off] - 1
	}
	if repeats > cfg.MQTT.SendWindow {
		t.Fatalf("%d repeats, want at most the window (%d)", repeats, cfg.MQTT.SendWindow)
	}
	t.Logf("%d offsets, %d delivered twice across the hand-over", total, repeats)
}
