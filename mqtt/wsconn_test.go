package mqtt

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/gorilla/websocket"
	"github.com/mochi-mqtt/server/v2/packets"
)

// newWSBroker starts a broker with its TCP listener and a WebSocket
// listener "ws" that allows origins.
func newWSBroker(tb testing.TB, m *Metrics, mutate func(*Config), origins ...string) *Broker {
	tb.Helper()
	return newTestBroker(tb, newMemLog(tb, "default=#"), func(c *Config) {
		c.Metrics = m
		c.Listeners = []Listener{{Name: "ws", Listen: "127.0.0.1:0", Protocol: ProtocolWebSocket, AllowedOrigins: origins}}
		if mutate != nil {
			mutate(c)
		}
	})
}

// dialWS connects an MQTT 3.1.1 paho client over WebSocket, sending
// origin when it is not empty.
func dialWS(tb testing.TB, b *Broker, id, origin string) (paho.Client, error) {
	tb.Helper()
	o := paho.NewClientOptions().
		AddBroker("ws://" + b.ListenerAddr("ws").String() + "/mqtt").
		SetClientID(id).SetProtocolVersion(4).
		SetAutoReconnect(false).SetConnectRetry(false).
		SetConnectTimeout(waitLimit)
	if origin != "" {
		o.SetHTTPHeaders(http.Header{"Origin": {origin}})
	}
	c := paho.NewClient(o)
	t := c.Connect()
	if !t.WaitTimeout(waitLimit) {
		tb.Fatalf("ws connect %s: no answer", id)
	}
	if t.Error() != nil {
		return nil, t.Error()
	}
	tb.Cleanup(func() { c.Disconnect(0) })
	return c, nil
}

func TestWebSocket_PublishSubscribe(t *testing.T) {
	b := newWSBroker(t, NewMetrics(nil), nil)
	if b.ListenerAddr("ws") == nil || b.ListenerAddr(DefaultListenerName) == nil {
		t.Fatalf("listeners: ws %v, mqtt %v, want both bound", b.ListenerAddr("ws"), b.ListenerAddr(DefaultListenerName))
	}
	wsSub, err := dialWS(t, b, "ws-sub", "")
	if err != nil {
		t.Fatal(err)
	}
	tcpSub, _ := dialV3(t, b, "tcp-sub")
	got := make(chan string, 4)
	for _, c := range []paho.Client{wsSub, tcpSub} {
		if tk := c.Subscribe("plant/#", 1, func(_ paho.Client, m paho.Message) {
			got <- m.Topic() + "=" + string(m.Payload())
		}); !tk.WaitTimeout(waitLimit) || tk.Error() != nil {
			t.Fatalf("subscribe: %v", tk.Error())
		}
	}
	pub, err := dialWS(t, b, "ws-pub", "")
	if err != nil {
		t.Fatal(err)
	}
	if tk := pub.Publish("plant/a", 1, false, "over ws"); !tk.WaitTimeout(waitLimit) || tk.Error() != nil {
		t.Fatalf("publish: %v", tk.Error())
	}
	for range 2 {
		select {
		case m := <-got:
			if m != "plant/a=over ws" {
				t.Fatalf("got %q", m)
			}
		case <-time.After(waitLimit):
			t.Fatal("a subscriber (ws or tcp) got nothing")
		}
	}
}

func TestWebSocket_Origin(t *testing.T) {
	m := NewMetrics(nil)
	b := newWSBroker(t, m, nil, "https://hmi.example:8443")
	if _, err := dialWS(t, b, "hmi", "https://HMI.example:8443"); err != nil {
		t.Fatalf("allowed origin refused: %v", err)
	}
	if _, err := dialWS(t, b, "tool", ""); err != nil {
		t.Fatalf("client without Origin (not a browser) refused: %v", err)
	}
	if _, err := dialWS(t, b, "evil", "https://evil.example"); err == nil {
		t.Fatal("a page of another origin connected")
	}
	url := "ws://" + b.ListenerAddr("ws").String() + "/mqtt"
	_, resp, err := websocket.DefaultDialer.Dial(url, http.Header{"Origin": {"https://evil.example"}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("dial from another origin: %v %v, want 403", resp, err)
	}
	if got := metricValue(m.Closed.WithLabelValues(ReasonWebSocketOrigin)); got != 2 {
		t.Fatalf("closed{websocket_origin} = %v, want 2", got)
	}

	t.Run("no list: same origin only", func(t *testing.T) {
		b := newWSBroker(t, NewMetrics(nil), nil)
		host := b.ListenerAddr("ws").String()
		if _, err := dialWS(t, b, "same", "http://"+host); err != nil {
			t.Fatalf("same origin refused: %v", err)
		}
		if _, err := dialWS(t, b, "other", "http://other.example"); err == nil {
			t.Fatal("another origin connected")
		}
	})
}

func TestWebSocket_Guard(t *testing.T) {
	m := NewMetrics(nil)
	b := newWSBroker(t, m, func(c *Config) {
		c.ConnectTimeout = 200 * time.Millisecond
		c.MaxConnectSize = 1 << 10
	})
	addr := b.ListenerAddr("ws").String()

	t.Run("no upgrade in time", func(t *testing.T) {
		conn := dialTCPAddr(t, addr)
		readUntilClosed(t, conn)
	})
	t.Run("upgraded, no CONNECT in time", func(t *testing.T) {
		ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		_ = ws.SetReadDeadline(time.Now().Add(waitLimit))
		if _, _, err := ws.ReadMessage(); err == nil {
			t.Fatal("got a message, want the connection closed")
		} else if isTimeout(err) {
			t.Fatal("connection still open")
		}
	})
	if got := metricValue(m.Closed.WithLabelValues(ReasonConnectTimeout)); got != 2 {
		t.Fatalf("closed{connect_timeout} = %v, want 2", got)
	}
	t.Run("CONNECT too large", func(t *testing.T) {
		ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		if err := ws.WriteMessage(websocket.BinaryMessage, connectHead(5, 1<<20)); err != nil {
			t.Fatal(err)
		}
		_ = ws.SetReadDeadline(time.Now().Add(waitLimit))
		_, msg, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if pk := decodeFirst(t, msg); pk.FixedHeader.Type != packets.Connack || pk.ReasonCode != packets.ErrPacketTooLarge.Code {
			t.Fatalf("got type %d reason %#x, want CONNACK 0x95", pk.FixedHeader.Type, pk.ReasonCode)
		}
	})
	if got := metricValue(m.Closed.WithLabelValues(ReasonConnectTooLarge)); got != 1 {
		t.Fatalf("closed{connect_too_large} = %v, want 1", got)
	}
	t.Run("plain HTTP is refused", func(t *testing.T) {
		resp, err := http.Get("http://" + addr + "/mqtt")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("status %d, want 400", resp.StatusCode)
		}
	})
	if got := metricValue(m.Closed.WithLabelValues(ReasonWebSocketHandshake)); got != 1 {
		t.Fatalf("closed{websocket_handshake} = %v, want 1", got)
	}
	t.Run("text message closes", func(t *testing.T) {
		ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		if err := ws.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
			t.Fatal(err)
		}
		_ = ws.SetReadDeadline(time.Now().Add(waitLimit))
		if _, _, err := ws.ReadMessage(); err == nil || isTimeout(err) {
			t.Fatalf("read after a text message: %v, want the connection closed", err)
		}
	})
}

// dialTCPAddr opens a bare TCP connection to addr, closed at cleanup.
func dialTCPAddr(tb testing.TB, addr string) net.Conn {
	tb.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

func TestListeners_Validate(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Listeners = []Listener{
		{Name: "mqtt", Listen: "127.0.0.1:0"},
		{Name: "a", Listen: "nope", Protocol: "http"},
		{Name: "b", Listen: ":1", AllowedOrigins: []string{"https://x"}},
		{Name: "c", Listen: ":2", Protocol: ProtocolWebSocket, AllowedOrigins: []string{"hmi.example"}},
	}
	err := cfg.Validate()
	for _, want := range []string{"listeners[0].name", "listeners[1].listen", "listeners[1].protocol",
		"listeners[2].allowed_origins", "listeners[3].allowed_origins"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want a problem naming %s", err, want)
		}
	}
}
