package edge

import (
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"
	dto "github.com/prometheus/client_model/go"

	"github.com/peatmq/peat/mqtt"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

func TestConfig_Listeners(t *testing.T) {
	t.Run("the list replaces mqtt.listen", func(t *testing.T) {
		cfg, err := Parse([]byte(`
auth: {users_file: users}
mqtt:
  listeners:
    - {name: local, listen: "127.0.0.1:1883"}
    - name: hmi
      listen: "0.0.0.0:9001"
      protocol: websocket
      tls: {cert_file: c, key_file: k}
      allowed_origins: ["https://hmi.example:8443"]
    - {listen: "0.0.0.0:8883", tls: {cert_file: c, key_file: k}}
`))
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Validate: %v", err)
		}
		bc := cfg.BrokerConfig()
		if bc.Listen != "" || len(bc.Listeners) != 3 {
			t.Fatalf("broker listen %q, %d listeners; want only the 3 listed", bc.Listen, len(bc.Listeners))
		}
		got := []string{bc.Listeners[0].Name, bc.Listeners[1].Name + "/" + bc.Listeners[1].Protocol, bc.Listeners[2].Name}
		if want := []string{"local", "hmi/websocket", "mqtt-2"}; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("listeners %v, want %v", got, want)
		}
		if err := cfg.Set("mqtt.listen", "nope", "flag --mqtt"); err != nil {
			t.Fatal(err)
		}
		if cfg.MQTT.Listeners[0].Listen != "nope" || cfg.MQTT.Listen != "" {
			t.Fatalf("--mqtt set listen %q, listeners[0] %q; want the first listener's", cfg.MQTT.Listen, cfg.MQTT.Listeners[0].Listen)
		}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "mqtt.listeners[0].listen (from flag --mqtt)") {
			t.Fatalf("Validate() = %v, want the bad address named with its source", err)
		}
	})

	cases := []struct {
		name string
		yaml string
		want []string // substrings of the error; none: valid
	}{
		{"both forms", "mqtt: {listen: '127.0.0.1:1883', listeners: [{listen: '127.0.0.1:1884'}]}",
			[]string{"mqtt.listen", "not both"}},
		{"mqtt.tls beside the list", "mqtt: {tls: {cert_file: c, key_file: k}, listeners: [{listen: '127.0.0.1:1884'}]}",
			[]string{"mqtt.tls", "give each listener its tls"}},
		{"network listener without TLS", "auth: {users_file: u}\nmqtt: {listeners: [{listen: '127.0.0.1:1883'}, {listen: '0.0.0.0:1884'}]}",
			[]string{"mqtt.listeners[1].listen", "mqtt.listeners[1].tls.cert_file", "mqtt.listeners[1].allow_plaintext: true"}},
		{"network websocket without auth", "mqtt: {listeners: [{listen: ':9001', protocol: websocket, allow_plaintext: true}]}",
			[]string{"mqtt.listeners[0].listen", "auth.users_file"}},
		{"network websocket opted out", "auth: {allow_anonymous: true}\nmqtt: {listeners: [{listen: ':9001', protocol: websocket, allow_plaintext: true}]}",
			nil},
		{"origins on an MQTT listener", "mqtt: {listeners: [{listen: '127.0.0.1:1', allowed_origins: ['https://a']}]}",
			[]string{"mqtt.listeners[0].allowed_origins"}},
		{"bad origin", "mqtt: {listeners: [{listen: '127.0.0.1:1', protocol: websocket, allowed_origins: [hmi.example]}]}",
			[]string{"mqtt.listeners[0].allowed_origins"}},
		{"bad protocol", "mqtt: {listeners: [{listen: '127.0.0.1:1', protocol: http}]}",
			[]string{"mqtt.listeners[0].protocol"}},
		{"duplicate names", "mqtt: {listeners: [{name: a, listen: '127.0.0.1:1'}, {name: a, listen: '127.0.0.1:2'}]}",
			[]string{"mqtt.listeners[1].name"}},
		{"listener TLS checked", "mqtt: {listeners: [{listen: '127.0.0.1:1', tls: {key_file: k}}]}",
			[]string{"mqtt.listeners[0].tls", "cert_file and key_file"}},
		{"missing address", "mqtt: {listeners: [{name: a}]}", []string{"mqtt.listeners[0].listen"}},
	}
	for _, tc := range cases {
		cfg, err := Parse([]byte(tc.yaml))
		if err == nil {
			err = cfg.Validate()
		}
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v does not say %q", tc.name, err, w)
			}
		}
	}
}

// wsClient connects an MQTT 3.1.1 paho client to n's listener "hmi" over
// wss, as a browser page at origin would, with a user and password.
func wsClient(tb testing.TB, n *Node, p *testPKI, id, origin, user, pw string) (paho.Client, error) {
	tb.Helper()
	o := paho.NewClientOptions().
		AddBroker("wss://" + n.MQTTListenerAddr("hmi").String() + "/mqtt").
		SetTLSConfig(&tls.Config{RootCAs: p.pool, ServerName: "127.0.0.1"}).
		SetHTTPHeaders(http.Header{"Origin": {origin}}).
		SetClientID(id).SetUsername(user).SetPassword(pw).SetProtocolVersion(4).
		SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(20 * time.Second)
	c := paho.NewClient(o)
	tk := c.Connect()
	if !tk.WaitTimeout(20 * time.Second) {
		tb.Fatalf("connect %s: no answer", id)
	}
	if tk.Error() != nil {
		return nil, tk.Error()
	}
	tb.Cleanup(func() { c.Disconnect(0) })
	return c, nil
}

// A node with plain MQTT on loopback for local processes and MQTT over
// secure WebSocket for browser HMIs: users, ACLs (per record too) and the
// origin check apply on the WebSocket listener, and a TCP publisher
// reaches a WebSocket subscriber.
func TestNode_WebSocketListener(t *testing.T) {
	p := newTestPKI(t, "unused")
	dir := t.TempDir()
	cfg := testConfig(t)
	cfg.MQTT.Listen = ""
	cfg.MQTT.Listeners = []ListenerConfig{
		{Name: "local", Listen: "127.0.0.1:0"},
		{Name: "hmi", Listen: "127.0.0.1:0", Protocol: mqtt.ProtocolWebSocket,
			TLS:            TLSConfig{CertFile: p.certFile, KeyFile: p.keyFile},
			AllowedOrigins: []string{"https://hmi.example:8443"}},
	}
	cfg.Auth.UsersFile = writeAuthFile(t, dir, "users", userLine(t, "alice", "pw-a")+userLine(t, "bob", "pw-b"))
	cfg.Auth.ACLFile = writeAuthFile(t, dir, "acl", `
allow readwrite user:alice #
deny  readwrite user:bob   secret/#
allow readwrite user:bob   plant/#
`)
	n := startNode(t, cfg)
	if n.MQTTAddr().String() != n.MQTTListenerAddr("local").String() {
		t.Fatalf("MQTTAddr %v, want the first listener's (%v)", n.MQTTAddr(), n.MQTTListenerAddr("local"))
	}
	const hmi = "https://hmi.example:8443"

	if _, err := wsClient(t, n, p, "bad-pw", hmi, "bob", "wrong"); err == nil {
		t.Fatal("a wrong password connected over wss")
	}
	if _, err := wsClient(t, n, p, "evil", "https://evil.example", "bob", "pw-b"); err == nil {
		t.Fatal("a page of another origin connected")
	}
	if got := closedCount(t, n, mqtt.ReasonWebSocketOrigin); got != 1 {
		t.Fatalf("closed{websocket_origin} = %v, want 1", got)
	}

	bob, err := wsClient(t, n, p, "bob-hmi", hmi, "bob", "pw-b")
	if err != nil {
		t.Fatalf("bob over wss: %v", err)
	}
	got := make(chan string, 8)
	tk := bob.Subscribe("#", 1, func(_ paho.Client, m paho.Message) { got <- m.Topic() })
	if !tk.WaitTimeout(20*time.Second) || tk.Error() != nil {
		t.Fatalf("subscribe #: %v", tk.Error())
	}
	if st := bob.Subscribe("secret/#", 1, nil); !st.WaitTimeout(20 * time.Second) {
		t.Fatal("subscribe secret/#: no SUBACK")
	} else if code := st.(*paho.SubscribeToken).Result()["secret/#"]; code != 0x80 {
		t.Fatalf("subscribe secret/#: SUBACK %#x, want 0x80", code)
	}

	// alice publishes over the local TCP listener: the denied record
	// first, so bob's first delivery shows whether it was held back.
	alice := dialUser(t, n, "alice", 4, "alice", "pw-a")
	if alice.Connack.ReasonCode != 0 {
		t.Fatalf("alice over TCP: CONNACK %#x", alice.Connack.ReasonCode)
	}
	alice.Publish("secret/door", 1, 1, "code")
	alice.Publish("plant/line1", 1, 2, "ok")
	select {
	case topic := <-got:
		if topic != "plant/line1" {
			t.Fatalf("bob got %q first, want plant/line1 (secret/ is denied to him)", topic)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("bob got nothing over wss")
	}

	t.Run("plain ws to the wss listener", func(t *testing.T) {
		o := paho.NewClientOptions().AddBroker("ws://" + n.MQTTListenerAddr("hmi").String() + "/mqtt").
			SetClientID("plain").SetUsername("bob").SetPassword("pw-b").
			SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(20 * time.Second)
		c := paho.NewClient(o)
		if tk := c.Connect(); tk.WaitTimeout(20*time.Second) && tk.Error() == nil {
			c.Disconnect(0)
			t.Fatal("connected without TLS")
		}
	})
}

// closedCount reads peat_mqtt_closed_connections_total{reason}.
func closedCount(tb testing.TB, n *Node, reason string) float64 {
	tb.Helper()
	var m dto.Metric
	if err := n.mqttMetrics.Closed.WithLabelValues(reason).Write(&m); err != nil {
		tb.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// cert_identity belongs to a listener: the same client certificate names
// its user on the listener that says so, and nobody on another that only
// verifies certificates.
func TestNode_CertIdentityPerListener(t *testing.T) {
	p := newTestPKI(t, "sensor-1")
	dir := t.TempDir()
	cfg := testConfig(t)
	cfg.MQTT.Listen = ""
	cfg.MQTT.Listeners = []ListenerConfig{
		{Name: "certs", Listen: "127.0.0.1:0", TLS: TLSConfig{CertFile: p.certFile, KeyFile: p.keyFile,
			ClientCAFile: p.caFile, ClientAuth: "require", CertIdentity: true}},
		{Name: "passwords", Listen: "127.0.0.1:0", TLS: TLSConfig{CertFile: p.certFile, KeyFile: p.keyFile,
			ClientCAFile: p.caFile, ClientAuth: "request"}},
	}
	cfg.Auth.UsersFile = writeAuthFile(t, dir, "users", userLine(t, "alice", "pw-a"))
	n := startNode(t, cfg)
	dial := func(name string) *mqtttest.Raw {
		conn, err := tls.Dial("tcp", n.MQTTListenerAddr(name).String(),
			&tls.Config{RootCAs: p.pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{p.client}})
		if err != nil {
			t.Fatalf("TLS dial %s: %v", name, err)
		}
		return mqtttest.Handshake(t, conn, mqtttest.Connect{ClientID: "dev", Version: 5, Clean: true, Keepalive: 60})
	}
	if c := dial("certs"); c.Connack.ReasonCode != 0 {
		t.Fatalf("certificate on the cert_identity listener: CONNACK %#x, want 0", c.Connack.ReasonCode)
	}
	if c := dial("passwords"); c.Connack.ReasonCode != packets.ErrBadUsernameOrPassword.Code &&
		c.Connack.ReasonCode != packets.ErrNotAuthorized.Code {
		t.Fatalf("certificate alone on the other listener: CONNACK %#x, want a refusal", c.Connack.ReasonCode)
	}
}
