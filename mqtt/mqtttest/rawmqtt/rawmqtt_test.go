package rawmqtt_test

import (
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest/rawmqtt"
)

// broker starts a mochi broker that lets in user "dev" with password
// "pw" only, and returns its address.
func broker(t *testing.T) string {
	t.Helper()
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.DiscardHandler), InlineClient: true})
	ledger := &auth.Ledger{
		Auth: auth.AuthRules{{Username: "dev", Password: "pw", Allow: true}},
		ACL:  auth.ACLRules{{Username: "dev", Filters: auth.Filters{"#": auth.ReadWrite}}},
	}
	if err := srv.AddHook(new(auth.Hook), &auth.Options{Ledger: ledger}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddListener(listeners.NewNet("t", ln)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// A client that subscribes gets its own QoS 1 publish back, at each
// protocol version, with the packet ids and payload it sent.
func TestConn_PublishesAndReceives(t *testing.T) {
	addr := broker(t)
	for _, version := range []byte{4, 5} {
		c, err := rawmqtt.Dial(addr, rawmqtt.Connect{ClientID: "c", Version: version, Clean: true,
			Username: "dev", Password: "pw"}, 10*time.Second)
		if err != nil {
			t.Fatalf("v%d: %v", version, err)
		}
		if c.Version() != version || c.Connack().FixedHeader.Type != packets.Connack {
			t.Fatalf("v%d: version %d, CONNACK %+v", version, c.Version(), c.Connack().FixedHeader)
		}
		if err := c.Send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 7,
			Filters: packets.Subscriptions{{Filter: "a/#", Qos: 1}}}); err != nil {
			t.Fatal(err)
		}
		if ack, err := c.NextWithin(10 * time.Second); err != nil || ack.FixedHeader.Type != packets.Suback || ack.PacketID != 7 {
			t.Fatalf("v%d: got %+v (%v), want the SUBACK of 7", version, ack.FixedHeader, err)
		}
		pub, err := c.Encode(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
			TopicName: "a/b", PacketID: 9, Payload: []byte("hello")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.NetConn().Write(pub); err != nil {
			t.Fatal(err)
		}
		var acked, delivered bool
		for !acked || !delivered {
			pk, err := c.NextWithin(10 * time.Second)
			if err != nil {
				t.Fatalf("v%d: %v", version, err)
			}
			switch pk.FixedHeader.Type {
			case packets.Puback:
				acked = pk.PacketID == 9
			case packets.Publish:
				delivered = pk.TopicName == "a/b" && string(pk.Payload) == "hello"
			}
		}
		_ = c.Close()
	}
}

// A refused login is a RefusedError with the CONNACK's code, which is
// ErrRefused; the connection is closed.
func TestDial_RefusedIsErrRefused(t *testing.T) {
	addr := broker(t)
	for version, want := range map[byte]byte{4: 0x05, 5: 0x86} { // not authorized; bad user name or password
		_, err := rawmqtt.Dial(addr, rawmqtt.Connect{ClientID: "c", Version: version, Username: "dev", Password: "wrong"}, 10*time.Second)
		var refused *rawmqtt.RefusedError
		if !errors.Is(err, rawmqtt.ErrRefused) || !errors.As(err, &refused) || refused.Code != want {
			t.Fatalf("v%d: %v, want a refusal with code %#x", version, err, want)
		}
	}
}
