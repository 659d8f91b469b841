package edge

import (
	"net"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// revokeWait is how soon a reload must reach a live connection.
const revokeWait = time.Second

// endsWithin reads c until the broker ends the connection and reports
// what it said: the DISCONNECT's reason code (MQTT 5), or 0 for a
// connection closed without one. It fails the test when the connection
// is still open after d.
func endsWithin(tb testing.TB, c *mqtttest.Raw, d time.Duration) byte {
	tb.Helper()
	got := make(chan byte, 1)
	go func() {
		for {
			pk, err := c.Next()
			if err != nil {
				got <- 0
				return
			}
			if pk.FixedHeader.Type == packets.Disconnect {
				got <- pk.ReasonCode
				return
			}
		}
	}()
	select {
	case code := <-got:
		return code
	case <-time.After(d):
		c.Close() // ends the reader
		tb.Fatalf("connection still open %v after the reload", d)
		return 0
	}
}

// SIGHUP reaches live connections: a user removed from the users file, or
// whose password changed, is disconnected at once (MQTT 5: DISCONNECT
// 0x87); a user whose line did not change stays connected.
func TestNode_ReloadDisconnectsRevokedUsers(t *testing.T) {
	dir := t.TempDir()
	carolLine := userLine(t, "carol", "pw-c")
	cfg := testConfig(t)
	cfg.Auth.UsersFile = writeAuthFile(t, dir, "users",
		userLine(t, "alice", "pw-a")+userLine(t, "bob", "pw-b")+userLine(t, "dave", "pw-d")+carolLine)
	cfg.Auth.ACLFile = writeAuthFile(t, dir, "acl", "allow readwrite * #\n")
	n := startNode(t, cfg)

	alice := dialUser(t, n, "alice-1", 5, "alice", "pw-a") // removed
	bob := dialUser(t, n, "bob-1", 5, "bob", "pw-b")       // new password
	dave := dialUser(t, n, "dave-1", 4, "dave", "pw-d")    // removed, MQTT 3.1.1
	carol := dialUser(t, n, "carol-1", 5, "carol", "pw-c") // unchanged
	for _, c := range []*mqtttest.Raw{alice, bob, dave, carol} {
		if c.Connack.ReasonCode != 0 {
			t.Fatalf("CONNACK %#x", c.Connack.ReasonCode)
		}
	}

	writeAuthFile(t, dir, "users", userLine(t, "bob", "pw-b2")+carolLine)
	if err := n.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	for name, c := range map[string]*mqtttest.Raw{"alice": alice, "bob": bob} {
		if code := endsWithin(t, c, revokeWait); code != packets.ErrNotAuthorized.Code {
			t.Errorf("%s: DISCONNECT %#x, want 0x87", name, code)
		}
	}
	endsWithin(t, dave, revokeWait)

	carol.Publish("x/carol", 1, 1, "m")
	if ack := carol.ReadUntil(packets.Puback); ack.ReasonCode != 0 {
		t.Errorf("carol, unchanged: PUBACK %#x", ack.ReasonCode)
	}
	if c := dialUser(t, n, "bob-2", 5, "bob", "pw-b"); c.Connack.ReasonCode == 0 {
		t.Error("bob's old password still lets him in")
	}
	if c := dialUser(t, n, "bob-3", 5, "bob", "pw-b2"); c.Connack.ReasonCode != 0 {
		t.Errorf("bob's new password: CONNACK %#x", c.Connack.ReasonCode)
	}
}

// A reload binds the next publish of a live connection: one the new ACL
// denies gets PUBACK 0x87 (MQTT 3.1.1: a disconnect), and a user the new
// users file no longer lists has no rights left, whatever the ACL says.
func TestNode_ReloadRevokesPublishRight(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t)
	aliceBob := userLine(t, "alice", "pw-a") + userLine(t, "bob", "pw-b")
	cfg.Auth.UsersFile = writeAuthFile(t, dir, "users", aliceBob+userLine(t, "gone", "pw-g"))
	cfg.Auth.ACLFile = writeAuthFile(t, dir, "acl", "allow readwrite * #\n")
	n := startNode(t, cfg)

	alice := dialUser(t, n, "alice-1", 5, "alice", "pw-a")
	bob := dialUser(t, n, "bob-1", 4, "bob", "pw-b")
	alice.Publish("plant/a", 1, 1, "m")
	if ack := alice.ReadUntil(packets.Puback); ack.ReasonCode != 0 {
		t.Fatalf("before the reload: PUBACK %#x", ack.ReasonCode)
	}
	bob.Publish("plant/b", 1, 1, "m")
	bob.ReadUntil(packets.Puback)
	gone := dialUser(t, n, "gone-1", 5, "gone", "pw-g")

	writeAuthFile(t, dir, "users", aliceBob)
	writeAuthFile(t, dir, "acl", "deny write * plant/#\nallow readwrite * #\n")
	if err := n.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	alice.Publish("plant/a", 1, 2, "m")
	if ack := alice.ReadUntil(packets.Puback); ack.ReasonCode != packets.ErrNotAuthorized.Code {
		t.Errorf("after the reload: PUBACK %#x, want 0x87", ack.ReasonCode)
	}
	bob.Publish("plant/b", 1, 2, "m")
	if !closedOrDenied(bob) {
		t.Error("MQTT 3.1.1: revoked publish acked")
	}
	_ = gone.Send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		TopicName: "other/x", PacketID: 1, Payload: []byte("m")}) // the broker may have closed it
	if !closedOrDenied(gone) {
		t.Error("a removed user's publish was acked")
	}
}

// A stored will is judged when it fires, under the rules then in force:
// a will whose topic an ACL reload has since denied is not published.
func TestNode_WillRecheckedWhenItFires(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t)
	cfg.Auth.UsersFile = writeAuthFile(t, dir, "users", userLine(t, "erin", "pw-e")+userLine(t, "frank", "pw-f"))
	cfg.Auth.ACLFile = writeAuthFile(t, dir, "acl", "allow readwrite * #\n")
	n := startNode(t, cfg)

	frank := dialUser(t, n, "frank-1", 5, "frank", "pw-f")
	frank.Subscribe("wills/#", 1)
	conn, err := net.Dial("tcp", n.MQTTAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	erin := mqtttest.Handshake(t, conn, mqtttest.Connect{ClientID: "erin-1", Version: 5, Clean: true, Keepalive: 60,
		Username: "erin", Password: "pw-e", Will: &mqtttest.Will{Topic: "wills/erin", Payload: []byte("gone"), Qos: 1}})
	if erin.Connack.ReasonCode != 0 {
		t.Fatalf("erin: CONNACK %#x", erin.Connack.ReasonCode)
	}

	// The will is refused once: when it fires, or at the reload if erin's
	// session was still being set up then (the will still mochi's).
	const denied = `peat_mqtt_denied_total{reason="publish"}`
	before := max(metricValue(t, n, denied), 0)
	writeAuthFile(t, dir, "acl", "deny write * wills/erin\nallow readwrite * #\n")
	if err := n.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	erin.Close() // no DISCONNECT: the will fires
	testwait.Eventually(t, "the will's refusal", func() bool { return metricValue(t, n, denied) > before })

	mqtttest.Dial(t, n.MQTTAddr().String(), mqtttest.Connect{ClientID: "frank-2", Version: 5, Clean: true,
		Username: "frank", Password: "pw-f"}).Publish("wills/after", 1, 1, "m")
	expectTopics(t, frank, "wills/after")
}
