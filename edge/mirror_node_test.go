package edge

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	pahov5 "github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/peatmq/peat/edge/mirror"
)

// mirrorProps are the peat-* properties a Peat sink sends with the record
// at off of a source whose log starts at first.
func mirrorProps(off, first uint64) pahov5.UserProperties {
	vals := map[string]string{
		mirror.PropStream: "default", mirror.PropOffset: strconv.FormatUint(off, 10), mirror.PropTime: "1700000000000",
		mirror.PropTopic: "sensors/a", mirror.PropClient: "dev", mirror.PropQoS: "1", mirror.PropExpiry: "0",
		mirror.PropFirst: strconv.FormatUint(first, 10),
	}
	var u pahov5.UserProperties
	for _, k := range mirror.Props {
		u.Add(k, vals[k])
	}
	return u
}

// A node with a mirror stream: ordinary publishes to its filters are
// refused; a
// $mirror publish is refused for a stream that is not a mirror, without
// the sink's properties, and after records the source still has; the next
// offset is appended and a resend acknowledged without a second record.
func TestNode_MirrorStreamTakesOnlyItsSourcesNextRecords(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t)
	cfg.Streams = append(cfg.Streams, StreamConfig{Name: "site-a.default", Mirror: true, Filters: []string{"site-a/#"}, Durability: "fsync"})
	cfg.Auth.UsersFile = writeAuthFile(t, dir, "users", userLine(t, "site-a", "pw-a")+userLine(t, "site-b", "pw-b"))
	cfg.Auth.ACLFile = writeAuthFile(t, dir, "acl", `
allow write user:site-a $mirror/site-a.default
allow write user:site-a $mirror/default
allow readwrite * site-a/#
allow readwrite * sensors/#
`)
	n := startNode(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := func(user string) *pahov5.Client {
		conn, err := net.Dial("tcp", n.MQTTAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		c := pahov5.NewClient(pahov5.ClientConfig{Conn: conn})
		if _, err := c.Connect(ctx, &pahov5.Connect{ClientID: user, CleanStart: true, KeepAlive: 30,
			Username: user, UsernameFlag: true, Password: []byte("pw-" + user[len(user)-1:]), PasswordFlag: true}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Disconnect(&pahov5.Disconnect{}) })
		return c
	}
	c, other := dial("site-a"), dial("site-b")
	// The ACL applies to $mirror/ as to any topic.
	resp, _ := other.Publish(ctx, &pahov5.Publish{Topic: "$mirror/site-a.default", QoS: 1, Payload: []byte("x"),
		Properties: &pahov5.PublishProperties{User: mirrorProps(0, 0)}})
	if resp == nil || resp.ReasonCode != 0x87 {
		t.Fatalf("$mirror publish of a user the ACL does not allow: %+v, want reason 0x87", resp)
	}
	publish := func(topic string, props pahov5.UserProperties) byte {
		t.Helper()
		resp, err := c.Publish(ctx, &pahov5.Publish{Topic: topic, QoS: 1, Payload: []byte("x"),
			Properties: &pahov5.PublishProperties{User: props}})
		if resp == nil {
			t.Fatalf("publish to %s: %v", topic, err)
		}
		return resp.ReasonCode
	}
	mirrorNext := func() uint64 { return n.Store().Stream("site-a.default").NextOffset() }

	if code := publish("sensors/a", nil); code != 0 {
		t.Fatalf("ordinary publish: reason %#x", code)
	}
	if code := publish("site-a/x", nil); code != 0x90 {
		t.Errorf("ordinary publish to the mirror's filter: reason %#x, want 0x90", code)
	}
	if code := publish("$mirror/default", mirrorProps(0, 0)); code != 0x90 {
		t.Errorf("$mirror to a stream that is not a mirror: reason %#x, want 0x90", code)
	}
	if code := publish("$mirror/site-a.default", nil); code != 0x83 {
		t.Errorf("$mirror without the sink's properties: reason %#x, want 0x83", code)
	}
	for _, off := range []uint64{0, 1, 1} {
		if code := publish("$mirror/site-a.default", mirrorProps(off, 0)); code != 0 {
			t.Fatalf("$mirror offset %d: reason %#x", off, code)
		}
	}
	if code := publish("$mirror/site-a.default", mirrorProps(5, 0)); code != 0x80 {
		t.Errorf("$mirror offset 5 while the source still has 2..4: reason %#x, want 0x80", code)
	}
	if got := mirrorNext(); got != 2 {
		t.Fatalf("the mirror ends at %d, want 2 (offsets 0 and 1, once each)", got)
	}
	if got := n.Store().Stream("default").NextOffset(); got != 1 {
		t.Fatalf("default holds %d records, want the one ordinary publish", got)
	}
	// The source's retention dropped 2..4 before they were sent.
	if code := publish("$mirror/site-a.default", mirrorProps(5, 5)); code != 0 {
		t.Fatalf("$mirror offset 5 after the source dropped 2..4: reason %#x", code)
	}
	for result, want := range map[string]float64{"appended": 3, "duplicate": 1, "refused": 1, "gap": 3} {
		if got := testutil.ToFloat64(n.mu.mirror.Records().WithLabelValues("site-a.default", result)); got != want {
			t.Errorf("peat_mirror_records_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	recs, err := n.Store().Stream("site-a.default").Read(0, 0, 0)
	if err != nil || len(recs) != 6 {
		t.Fatalf("mirror holds %d records (%v), want 6", len(recs), err)
	}
	for i, r := range recs {
		gap := i >= 2 && i <= 4
		switch {
		case r.Offset != uint64(i):
			t.Fatalf("record %d at offset %d", i, r.Offset)
		case gap && (r.Topic != mirror.GapTopic || r.UserProperties[0].Value != "2-5"):
			t.Fatalf("offset %d: %+v, want a gap marker 2-5", i, r)
		case !gap && (r.Topic != "sensors/a" || r.ClientID != "dev" || r.Timestamp != 1700000000000):
			t.Fatalf("offset %d: %+v, want the source's record", i, r)
		}
	}
}

// A mirror stream may have no filters (its records come from its
// source); any other stream needs one.
func TestValidate_MirrorStreamNeedsNoFilters(t *testing.T) {
	cfg := testConfig(t)
	cfg.Streams = append(cfg.Streams, defaultStream("site-a.default"))
	cfg.Streams[1].Mirror = true
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a mirror without filters: %v", err)
	}
	cfg.Streams[1].Mirror = false
	wantProblems(t, cfg.Validate(), []string{"streams[1].filters: ", "at least one"})
}
