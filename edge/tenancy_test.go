package edge

import (
	"fmt"
	"github.com/vmihailenco/msgpack/v5"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// tenancyACL lets every user read and write sensors/#, use the consumer
// groups named after it, and admin everything, groups included.
const tenancyACL = `
allow readwrite user:admin #
allow readwrite user:admin group:*
allow readwrite *          sensors/#
allow readwrite *          group:%u.*
`

// tenancyNode starts a node with users alice, bob and admin (password
// pw-<name>) and the ACL acl.
func tenancyNode(t *testing.T, acl string, mutate func(*Config)) *Node {
	t.Helper()
	dir := t.TempDir()
	cfg := testConfig(t)
	cfg.Auth.UsersFile = writeAuthFile(t, dir, "users",
		userLine(t, "alice", "pw-alice")+userLine(t, "bob", "pw-bob")+userLine(t, "admin", "pw-admin"))
	cfg.Auth.ACLFile = writeAuthFile(t, dir, "acl", acl)
	if mutate != nil {
		mutate(&cfg)
	}
	return startNode(t, cfg)
}

// dialAs connects as user (password pw-<user>) and fails the test unless
// the CONNACK is a success.
func dialAs(t *testing.T, n *Node, id, user string, version byte) *mqtttest.Raw {
	t.Helper()
	c := dialUser(t, n, id, version, user, "pw-"+user)
	if c.Connack.ReasonCode != 0 {
		t.Fatalf("%s as %s: CONNACK %#x (%s)", id, user, c.Connack.ReasonCode, c.Connack.Properties.ReasonString)
	}
	return c
}

// refusedSubscribe subscribes c to filter and fails the test unless the
// SUBACK is 0x87 (MQTT 5; 0x80 for 3.1.1) with a reason string that does
// not name secret.
func refusedSubscribe(t *testing.T, c *mqtttest.Raw, filter string, v5 bool, secret string) {
	t.Helper()
	ack := c.TrySubscribe(filter, 1)
	want := packets.ErrNotAuthorized.Code
	if !v5 {
		want = packets.ErrUnspecifiedError.Code
	}
	if len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] != want {
		t.Fatalf("subscribe %s: SUBACK %v (%s), want %#x", filter, ack.ReasonCodes, ack.Properties.ReasonString, want)
	}
	if v5 && ack.Properties.ReasonString == "" {
		t.Errorf("subscribe %s: refused without a reason string", filter)
	}
	if secret != "" && strings.Contains(ack.Properties.ReasonString, secret) {
		t.Errorf("subscribe %s: reason %q tells the group's consumer %q", filter, ack.Properties.ReasonString, secret)
	}
}

// refusedCommit publishes a commit to topic and fails the test unless it
// is refused.
func refusedCommit(t *testing.T, c *mqtttest.Raw, topic string, id uint16) {
	t.Helper()
	c.Publish(topic, 1, id, "0")
	if !closedOrDenied(c) {
		t.Fatalf("commit to %s accepted", topic)
	}
}

// A consumer group is its user's: another user can neither consume it
// ($group), read its offsets nor commit them ($offsets), and the refusal
// does not name the group's consumer. A group whose name starts with $
// is Peat's own, out of reach even of a user the ACL allows every group.
func TestNode_ConsumerGroupsBelongToTheirUsers(t *testing.T) {
	n := tenancyNode(t, tenancyACL, nil)

	alice := dialAs(t, n, "alice-secret-device", "alice", 5)
	alice.Subscribe("$group/alice.jobs/+/sensors/#", 1)
	alice.Subscribe("$offsets/alice.jobs/default", 1)
	alice.Publish("$offsets/alice.jobs/default", 1, 7, "0")
	if closedOrDenied(alice) {
		t.Fatal("alice's commit to her own group was refused")
	}

	for _, v := range []byte{5, 4} {
		bob := dialAs(t, n, fmt.Sprintf("bob-v%d", v), "bob", v)
		refusedSubscribe(t, bob, "$group/alice.jobs/+/sensors/#", v == 5, "alice-secret-device")
		refusedSubscribe(t, bob, "$offsets/alice.jobs/default", v == 5, "")
		bob.Subscribe(fmt.Sprintf("$group/bob.jobs-v%d/+/sensors/#", v), 1) // his own
		if v == 5 {
			refusedCommit(t, bob, "$offsets/alice.jobs/default", 9)
		}
	}

	admin := dialAs(t, n, "admin-1", "admin", 5)
	admin.Subscribe("$offsets/alice.jobs/default", 1) // group:* lets admin watch
	for _, g := range []string{"$sink.cloud", "$anything"} {
		refusedSubscribe(t, admin, "$group/"+g+"/+/sensors/#", true, "")
		refusedSubscribe(t, admin, "$offsets/"+g+"/default", true, "")
		refusedCommit(t, admin, "$offsets/"+g+"/default", 11)
	}
}

// Without auth (a loopback node), groups are open as before, but the
// ones whose names start with $ are still Peat's own.
func TestNode_DollarGroupsAreOutOfReachWithoutAuth(t *testing.T) {
	n := startNode(t, testConfig(t))
	c := mqtttest.Dial(t, n.MQTTAddr().String(), mqtttest.Connect{ClientID: "anyone", Version: 5, Clean: true})
	c.Subscribe("$group/jobs/+/sensors/#", 1)
	c.Subscribe("$offsets/jobs/default", 1)
	refusedSubscribe(t, c, "$group/$sink.cloud/+/sensors/#", true, "")
	refusedSubscribe(t, c, "$offsets/$sink.cloud/default", true, "")
	refusedCommit(t, c, "$offsets/$sink.cloud/default", 3)
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// A sink's backlog survives an admin's attempt to consume or move it over
// MQTT: its position stays where it was.
func TestNode_SinkBacklogSurvivesAnMQTTClient(t *testing.T) {
	n := tenancyNode(t, tenancyACL, func(c *Config) {
		sc := sinkConfig(t, closedPort(t)) // an upstream outage
		c.Sinks = sc.Sinks
	})
	admin := dialAs(t, n, "admin-1", "admin", 5)
	for i := range 10 {
		admin.Publish("sensors/a", 1, uint16(i+1), "m")
		if closedOrDenied(admin) {
			t.Fatal("publish refused")
		}
	}
	position := func() uint64 {
		off, _, _ := n.broker.Load().GroupOffset("$sink.cloud", "default")
		return off
	}
	before := position()

	ack := admin.TrySubscribe("$group/$sink.cloud/+/sensors/#", 1)
	if ack.ReasonCodes[0] != packets.ErrNotAuthorized.Code {
		// Drain what it was given, acknowledged: that is what moves a sink.
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) && position() == before {
			_ = admin.Conn().SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if pk, err := admin.Next(); err == nil && pk.FixedHeader.Type == packets.Publish {
				admin.Puback(pk.PacketID)
			}
		}
		t.Errorf("$group/$sink.cloud: SUBACK %#x, want 0x87", ack.ReasonCodes[0])
	}
	_ = admin.Conn().SetReadDeadline(time.Time{})
	admin.Publish("$offsets/$sink.cloud/default", 1, 100, "10")
	if !closedOrDenied(admin) {
		t.Error("commit to $offsets/$sink.cloud accepted")
	}
	time.Sleep(300 * time.Millisecond) // a commit or an acknowledgement would land meanwhile
	if got := position(); got != before {
		t.Errorf("the sink's position moved from %d to %d: its backlog is lost upstream", before, got)
	}
}

// persistentConnect is a CONNECT of a session that outlives its
// connection.
func persistentConnect(id, user string, version byte) mqtttest.Connect {
	c := mqtttest.Connect{ClientID: id, Version: version, Keepalive: 60, Username: user, Password: "pw-" + user}
	if version == 5 {
		c.Properties = packets.Properties{SessionExpiryInterval: 3600, SessionExpiryIntervalFlag: true}
	}
	return c
}

// A persistent session is its user's: another user connecting with its
// client id, while the owner is connected or after, with Clean Start 0 or
// 1, is refused (MQTT 5 0x87, 3.1.1 return code 5), counted, and neither
// ends the owner's connection nor resumes, ends or changes the session.
func TestNode_SessionBelongsToItsUser(t *testing.T) {
	n := tenancyNode(t, tenancyACL, nil)
	alice := mqtttest.Handshake(t, dialMQTT(t, n), persistentConnect("dev-1", "alice", 5))
	if alice.Connack.ReasonCode != 0 {
		t.Fatalf("alice: CONNACK %#x", alice.Connack.ReasonCode)
	}
	alice.Subscribe("sensors/#", 1)

	refused := 0
	try := func(clean bool, version byte) {
		t.Helper()
		c := persistentConnect("dev-1", "bob", version)
		c.Clean = clean
		bob := mqtttest.Handshake(t, dialMQTT(t, n), c)
		want := packets.ErrNotAuthorized.Code
		if version == 4 {
			want = packets.Err3NotAuthorized.Code
		}
		if bob.Connack.ReasonCode != want || bob.Connack.SessionPresent {
			t.Fatalf("bob as dev-1 (v%d, clean %v): CONNACK %#x present %v, want %#x",
				version, clean, bob.Connack.ReasonCode, bob.Connack.SessionPresent, want)
		}
		refused++
	}
	for _, v := range []byte{5, 4} {
		try(false, v)
		try(true, v)
	}
	// alice is still connected, and still gets her messages.
	pub := dialAs(t, n, "pub", "admin", 5)
	pub.Publish("sensors/live", 1, 1, "m")
	expectTopics(t, alice, "sensors/live")

	// Disconnected, the session waits for alice, not for bob.
	alice.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	alice.Close()
	time.Sleep(100 * time.Millisecond)
	pub.Publish("sensors/missed", 1, 2, "m")
	for _, v := range []byte{5, 4} {
		try(false, v)
		try(true, v)
	}
	again := mqtttest.Handshake(t, dialMQTT(t, n), persistentConnect("dev-1", "alice", 5))
	if again.Connack.ReasonCode != 0 || !again.Connack.SessionPresent {
		t.Fatalf("alice again: CONNACK %#x present %v, want her session", again.Connack.ReasonCode, again.Connack.SessionPresent)
	}
	expectTopics(t, again, "sensors/missed")
	if got := metricValue(t, n, `peat_mqtt_denied_total{reason="session"}`); got != float64(refused) {
		t.Errorf("peat_mqtt_denied_total{reason=\"session\"} = %v, want %d", got, refused)
	}
}

// A client-id rule in the ACL binds each user to its own client ids:
// another id is refused with MQTT 5 0x85, 3.1.1 return code 2, and
// counted.
func TestNode_ClientIDRules(t *testing.T) {
	n := tenancyNode(t, `
allow connect   user:admin clientid:*
allow connect   *          clientid:%u-*
allow readwrite *          sensors/#
`, nil)
	dialAs(t, n, "alice-1", "alice", 5)
	dialAs(t, n, "bob-7", "bob", 4)
	dialAs(t, n, "anything", "admin", 5)
	for _, tc := range []struct {
		id, user string
		version  byte
		want     byte
	}{
		{"bob-1", "alice", 5, packets.ErrClientIdentifierNotValid.Code},
		{"alice", "alice", 5, packets.ErrClientIdentifierNotValid.Code}, // %u-* needs the dash
		{"alice-1", "bob", 4, packets.Err3ClientIdentifierNotValid.Code},
	} {
		c := dialUser(t, n, tc.id, tc.version, tc.user, "pw-"+tc.user)
		if c.Connack.ReasonCode != tc.want {
			t.Errorf("%s as %s (v%d): CONNACK %#x, want %#x", tc.id, tc.user, tc.version, c.Connack.ReasonCode, tc.want)
		}
	}
	if got := metricValue(t, n, `peat_mqtt_denied_total{reason="client_id"}`); got != 3 {
		t.Errorf("peat_mqtt_denied_total{reason=\"client_id\"} = %v, want 3", got)
	}
}

// tenancySite starts a site of three in-process nodes with users alice
// and bob and tenancyACL.
func tenancySite(t *testing.T) []*Node {
	t.Helper()
	dir := t.TempDir()
	users := writeAuthFile(t, dir, "users", userLine(t, "alice", "pw-alice")+userLine(t, "bob", "pw-bob"))
	acl := writeAuthFile(t, dir, "acl", tenancyACL)
	withAuth := func(c Config) Config {
		c.Auth.UsersFile, c.Auth.ACLFile = users, acl
		return c
	}
	first := startNode(t, withAuth(siteConfig(t, "n1", 3)))
	seed := first.site.Load().Node.SerfAddr()
	nodes := []*Node{first,
		startNode(t, withAuth(siteConfig(t, "n2", 3, seed))),
		startNode(t, withAuth(siteConfig(t, "n3", 3, seed)))}
	testwait.Eventually(t, "the site", func() bool {
		for _, n := range nodes {
			if n.site.Load().Log.Stream("default") == nil {
				return false
			}
		}
		return true
	})
	return nodes
}

// In a site, a session's owner travels with it: another user connecting
// with its client id on another node is refused there, while the owner
// is connected (the owner's connection stays) and after.
func TestCluster_SessionBelongsToItsUser(t *testing.T) {
	nodes := tenancySite(t)
	alice := mqtttest.Handshake(t, dialMQTT(t, nodes[0]), persistentConnect("dev-1", "alice", 5))
	if alice.Connack.ReasonCode != 0 {
		t.Fatalf("alice: CONNACK %#x", alice.Connack.ReasonCode)
	}
	alice.Subscribe("sensors/#", 1) // the SUBACK waits until the site holds the session
	bobTries := func() {
		t.Helper()
		bob := mqtttest.Handshake(t, dialMQTT(t, nodes[1]), persistentConnect("dev-1", "bob", 5))
		if bob.Connack.ReasonCode != packets.ErrNotAuthorized.Code || bob.Connack.SessionPresent {
			t.Fatalf("bob as dev-1 on another node: CONNACK %#x present %v, want 0x87",
				bob.Connack.ReasonCode, bob.Connack.SessionPresent)
		}
	}
	bobTries()
	alice.Ping()
	if pk := alice.ReadUntil(packets.Pingresp); pk.FixedHeader.Type != packets.Pingresp {
		t.Fatal("alice's connection ended")
	}
	alice.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	alice.Close()
	time.Sleep(200 * time.Millisecond)
	bobTries()
	again := mqtttest.Handshake(t, dialMQTT(t, nodes[1]), persistentConnect("dev-1", "alice", 5))
	if again.Connack.ReasonCode != 0 || !again.Connack.SessionPresent {
		t.Fatalf("alice on another node: CONNACK %#x present %v, want her session", again.Connack.ReasonCode, again.Connack.SessionPresent)
	}
}

// A session resumed for one connection only (Clean Start 0, expiry 0)
// is its user's while that connection lasts, site-wide: another user
// with its client id on another node is refused, whether or not it asks
// for a session of its own, and the owner's connection stays. Once the
// owner's connection ends, so does the session, and the client id is
// free again.
func TestCluster_TransientSessionBelongsToItsUser(t *testing.T) {
	nodes := tenancySite(t)

	alice := resumeTransient(t, nodes[0], "dev-1", "alice")
	for _, bob := range []mqtttest.Connect{persistentConnect("dev-1", "bob", 5),
		{ClientID: "dev-1", Version: 5, Clean: true, Keepalive: 60, Username: "bob", Password: "pw-bob"}} {
		got := mqtttest.Handshake(t, dialMQTT(t, nodes[1]), bob)
		if got.Connack.ReasonCode != packets.ErrNotAuthorized.Code {
			t.Fatalf("bob as dev-1 (clean %v) on another node: CONNACK %#x, want 0x87", bob.Clean, got.Connack.ReasonCode)
		}
		got.Close()
	}
	alice.Ping()
	if pk := alice.ReadUntil(packets.Pingresp); pk.FixedHeader.Type != packets.Pingresp {
		t.Fatal("alice's connection ended")
	}

	alice.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	alice.Close()
	testwait.Eventually(t, "dev-1 free after alice's session ended", func() bool {
		bob := mqtttest.Handshake(t, dialMQTT(t, nodes[1]), persistentConnect("dev-1", "bob", 5))
		defer bob.Close()
		return bob.Connack.ReasonCode == 0 && !bob.Connack.SessionPresent
	})
}

// A transient session's owner is forgotten when the node holding its
// connection dies: the node that adopts what it held deletes the record
// of the owner, and the client id is free again.
func TestCluster_TransientOwnerOfADeadNodeIsForgotten(t *testing.T) {
	nodes := tenancySite(t)
	alice := resumeTransient(t, nodes[2], "dev-2", "alice")
	defer alice.Close()
	eventually(t, "n1's replica holding alice's transient session as its owner only", func() bool {
		return sessionOwnerOnly(t, nodes[0], "dev-2")
	})
	killNode(t, nodes[2])
	eventually(t, "the owner's record deleted", func() bool { return !sessionStored(t, nodes[0], "dev-2") })
	bob := mqtttest.Handshake(t, dialMQTT(t, nodes[1]), persistentConnect("dev-2", "bob", 5))
	defer bob.Close()
	if bob.Connack.ReasonCode != 0 || bob.Connack.SessionPresent {
		t.Fatalf("bob as dev-2: CONNACK %#x present %v, want a new session", bob.Connack.ReasonCode, bob.Connack.SessionPresent)
	}
}

// resumeTransient makes user's persistent session of client id on n, then
// resumes it on n with Clean Start 0 and no Session Expiry Interval: a
// session that ends with the connection it returns.
func resumeTransient(t *testing.T, n *Node, id, user string) *mqtttest.Raw {
	t.Helper()
	first := mqtttest.Handshake(t, dialMQTT(t, n), persistentConnect(id, user, 5))
	if first.Connack.ReasonCode != 0 {
		t.Fatalf("%s: CONNACK %#x", user, first.Connack.ReasonCode)
	}
	first.Subscribe("sensors/#", 1) // the SUBACK waits until the site holds the session
	first.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	first.Close()
	transient := mqtttest.Connect{ClientID: id, Version: 5, Keepalive: 60, Username: user, Password: "pw-" + user}
	var c *mqtttest.Raw
	testwait.Eventually(t, user+"'s session resumed", func() bool {
		c = mqtttest.Handshake(t, dialMQTT(t, n), transient)
		if c.Connack.ReasonCode == 0 && c.Connack.SessionPresent {
			return true
		}
		c.Close()
		return false
	})
	return c
}

// sessionOwnerOnly reports whether n's copy of the site's sessions holds
// client id's record as the owner of a transient session only (mqtt's
// msgpack field "oo").
func sessionOwnerOnly(t *testing.T, n *Node, id string) bool {
	t.Helper()
	var ownerOnly bool
	err := n.site.Load().Log.SessionState().LoadState("s/"+id, func(k string, v []byte) error {
		var rec struct {
			OwnerOnly bool `msgpack:"oo"`
		}
		if k == "s/"+id && msgpack.Unmarshal(v, &rec) == nil {
			ownerOnly = rec.OwnerOnly
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read the sessions on %s: %v", n.cfg.Cluster.NodeID, err)
	}
	return ownerOnly
}
