package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// listenerAddr is the address peat logged for its MQTT listener name.
func (p *peatProc) listenerAddr(name string) string {
	p.t.Helper()
	for _, line := range strings.Split(p.log(), "\n") {
		var rec struct{ Msg, Listener, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "mqtt listening" && rec.Listener == name {
			return rec.Addr
		}
	}
	p.t.Fatalf("no \"mqtt listening\" line for listener %s\n%s", name, p.log())
	return ""
}

// A real peat whose file lists its listeners: --mqtt still sets the
// first one's address, and a message a WebSocket client publishes is
// read back over the TCP listener by mosquitto_sub.
func TestServe_ListenersFromFile(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "peat.yaml")
	if err := os.WriteFile(cfgFile, []byte(`mqtt:
  listeners:
    - {name: local, listen: "127.0.0.1:1"}
    - {name: hmi, listen: "127.0.0.1:0", protocol: websocket}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startPeat(t, t.TempDir(), "--config", cfgFile)
	if got := p.listenerAddr("local"); got != p.mqttAddr || strings.HasSuffix(got, ":1") {
		t.Fatalf("listener local on %s (node serving MQTT on %s), want the --mqtt address", got, p.mqttAddr)
	}

	c := paho.NewClient(paho.NewClientOptions().AddBroker("ws://" + p.listenerAddr("hmi") + "/mqtt").
		SetClientID("hmi-page").SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(time.Minute))
	if tk := c.Connect(); !tk.WaitTimeout(time.Minute) || tk.Error() != nil {
		t.Fatalf("connect over ws: %v", tk.Error())
	}
	defer c.Disconnect(0)
	if tk := c.Publish("hmi/button", 1, false, "pressed"); !tk.WaitTimeout(time.Minute) || tk.Error() != nil {
		t.Fatalf("publish over ws: %v", tk.Error())
	}
	sub := startMosquittoSub(t, p.mqttAddr, "-q", "1", "-t", "$replay/earliest/+/hmi/#")
	sub.expect(map[string]bool{"$replay/earliest/0/hmi/button pressed": true})
}
