package edge

import (
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/source/peatsource"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// peatSourceNode starts a node with a mirror stream "hq" that a peat
// source fills from hq, logging in as user (none when empty) with client
// id down-<user> (two users may not share one client id at hq).
func peatSourceNode(t *testing.T, hq *Node, user, passwordFile string) *Node {
	t.Helper()
	cfg := testConfig(t)
	cfg.Streams = append(cfg.Streams, StreamConfig{Name: "hq", Mirror: true, Filters: []string{"hq/#"}})
	cfg.Sources = []SourceConfig{{
		Name: "hq", Backoff: BackoffConfig{Min: Duration(50 * time.Millisecond), Max: Duration(200 * time.Millisecond)},
		StallAfter: Duration(source.DefaultStallAfter),
		Peat: &SourcePeatConfig{URL: "mqtt://" + hq.MQTTAddr().String(), ClientID: "down-" + user, Username: user,
			PasswordFile: passwordFile, Filter: "#", Topic: "hq/{topic}", Window: 16,
			Keepalive: Duration(peatsource.DefaultKeepalive)},
	}}
	return startNode(t, cfg)
}

// mirrored waits for the first record of n's mirror stream and returns it.
func mirrored(t *testing.T, n *Node) *logstore.Record {
	t.Helper()
	st := n.Store().Stream("hq")
	eventually(t, "the record mirrored", func() bool { return st.Committed() >= 1 })
	recs, err := st.Read(0, 1, 0)
	if err != nil || len(recs) != 1 {
		t.Fatalf("read the mirror: %v %v", recs, err)
	}
	return recs[0]
}

// publishAs publishes one QoS 1 record to n as client id (and user, when
// set) and waits for its PUBACK.
func publishAs(t *testing.T, n *Node, id, user, pw, topic string) {
	t.Helper()
	c := dialUser(t, n, id, 5, user, pw)
	defer c.Close()
	if c.Connack.ReasonCode != 0 {
		t.Fatalf("%s: CONNACK %#x", id, c.Connack.ReasonCode)
	}
	c.Publish(topic, 1, 1, "on")
	if ack := c.ReadUntil(packets.Puback); ack.ReasonCode != 0 {
		t.Fatalf("%s: PUBACK %#x", id, ack.ReasonCode)
	}
}

// A record a Peat source mirrors carries the client id HQ's publisher
// used, as the record at HQ does; a local $replay that asks shows it.
// Under an ACL at HQ, only a source whose user a clientid read rule names
// gets it: another source mirrors the record without it.
func TestNode_PeatSourceRecordsCarryTheHQPublishersClientID(t *testing.T) {
	t.Run("hq without auth", func(t *testing.T) {
		hq := startNode(t, testConfig(t))
		publishAs(t, hq, "hq-sensor-1", "", "", "cmd/dev1")
		site := peatSourceNode(t, hq, "", "")
		r := mirrored(t, site)
		if r.Topic != "hq/cmd/dev1" || r.ClientID != "hq-sensor-1" {
			t.Errorf("mirrored record %q from client %q, want hq/cmd/dev1 from hq-sensor-1", r.Topic, r.ClientID)
		}

		// The site's own $replay shows it to a reader that asks.
		c := mqtttest.Dial(t, site.MQTTAddr().String(), mqtttest.Connect{ClientID: "ops", Version: 5, Clean: true, Keepalive: 60})
		c.Write(packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
			PacketID:    1,
			Filters:     packets.Subscriptions{{Filter: "$replay/earliest/+/hq/#", Qos: 1}},
			Properties:  packets.Properties{User: []packets.UserProperty{{Key: "client", Val: "true"}}},
		})
		c.ReadUntil(packets.Suback)
		pk := c.ReadUntil(packets.Publish)
		u := pk.Properties.User
		if len(u) == 0 || u[len(u)-1].Key != "client" || u[len(u)-1].Val != "hq-sensor-1" {
			t.Errorf("local $replay delivery's user properties %v, want client hq-sensor-1 last", u)
		}
	})

	t.Run("hq's ACL decides", func(t *testing.T) {
		dir := t.TempDir()
		cfg := testConfig(t)
		cfg.Auth.UsersFile = writeAuthFile(t, dir, "users",
			userLine(t, "sensor", "pw-s")+userLine(t, "site-a", "pw-a")+userLine(t, "site-b", "pw-b"))
		cfg.Auth.ACLFile = writeAuthFile(t, dir, "acl", `
allow read      user:site-a clientid:hq-*
allow readwrite *           #
`)
		hq := startNode(t, cfg)
		publishAs(t, hq, "hq-sensor-1", "sensor", "pw-s", "cmd/dev1")
		a := peatSourceNode(t, hq, "site-a", writeAuthFile(t, dir, "pw-a", "pw-a"))
		b := peatSourceNode(t, hq, "site-b", writeAuthFile(t, dir, "pw-b", "pw-b"))
		if r := mirrored(t, a); r.ClientID != "hq-sensor-1" {
			t.Errorf("site-a's mirror: client %q, want hq-sensor-1 (its clientid read rule)", r.ClientID)
		}
		if r := mirrored(t, b); r.ClientID != "" || r.Topic != "hq/cmd/dev1" {
			t.Errorf("site-b's mirror: %q from client %q, want hq/cmd/dev1 without a client (no rule shows it)", r.Topic, r.ClientID)
		}
	})
}
