package edge

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// publishRetained publishes one retained QoS 1 message and waits for its
// PUBACK.
func publishRetained(tb testing.TB, addr net.Addr, topic, payload string, retain bool) {
	tb.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr.String()).
		SetClientID(fmt.Sprintf("pub-%d", time.Now().UnixNano())).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		tb.Fatalf("connect to %v: %v", addr, tok.Error())
	}
	defer c.Disconnect(0)
	if tok := c.Publish(topic, 1, retain, payload); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		tb.Fatalf("publish to %s: %v", topic, tok.Error())
	}
}

// A node restarted on its data directory still has the retained messages
// of captured topics, without any publish after the restart, and a topic
// cleared by an empty retained payload stays cleared.
func TestNode_RestartKeepsRetainedMessages(t *testing.T) {
	cfg := testConfig(t)
	n := startNode(t, cfg)
	publishRetained(t, n.MQTTAddr(), "r/a", "a1", true)
	publishRetained(t, n.MQTTAddr(), "r/a", "a2", true)
	publishRetained(t, n.MQTTAddr(), "r/b", "b1", true)
	publishRetained(t, n.MQTTAddr(), "r/b", "", true)
	if err := n.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	m := startNode(t, cfg)
	msgs := make(chan paho.Message, 16)
	sub := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + m.MQTTAddr().String()).
		SetClientID("sub").SetAutoReconnect(false))
	if tok := sub.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer sub.Disconnect(0)
	if tok := sub.Subscribe("r/#", 1, func(_ paho.Client, msg paho.Message) { msgs <- msg }); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	next := func() paho.Message {
		t.Helper()
		select {
		case msg := <-msgs:
			return msg
		case <-time.After(30 * time.Second): // only stops a hang
			t.Fatal("no message")
			return nil
		}
	}
	if msg := next(); msg.Topic() != "r/a" || string(msg.Payload()) != "a2" || !msg.Retained() {
		t.Fatalf("first message after restart: %s %q retained=%v, want r/a a2 retained", msg.Topic(), msg.Payload(), msg.Retained())
	}
	// mochi sends a filter's retained messages in one go, on subscribe: a
	// live message published now comes after any of them.
	publishRetained(t, m.MQTTAddr(), "r/live", "marker", false)
	if msg := next(); msg.Topic() != "r/live" || msg.Retained() {
		t.Fatalf("after r/a got %s %q retained=%v, want the live marker (r/b was cleared)", msg.Topic(), msg.Payload(), msg.Retained())
	}
}
