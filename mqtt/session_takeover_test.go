package mqtt

import (
	"testing"

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// A session whose Session Expiry Interval is 0 ends when its connection
// closes (MQTT 5 3.1.2.11.2), so a connection that takes it over with
// Clean Start 0 finds no session: CONNACK Session Present 0
// [MQTT-3.2.2-3], and none of the old connection's subscriptions.
func TestSessionTakeover_ExpiryZeroLeavesNothingToResume(t *testing.T) {
	for name, next := range map[string]mqtttest.Connect{
		"by a connection with expiry 0": {ClientID: "tk", Version: 5, Keepalive: 60},
		"by a persistent connection":    durableConnect("tk", 5),
	} {
		t.Run(name, func(t *testing.T) {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			b := newTestBroker(t, l)
			old := mqtttest.Dial(t, b.Addr().String(), mqtttest.Connect{ClientID: "tk", Version: 5, Keepalive: 60})
			old.Subscribe("d/#", 1)
			c := mqtttest.Dial(t, b.Addr().String(), next) // Clean Start 0, while old is connected
			if c.Connack.SessionPresent {
				t.Fatal("CONNACK Session Present 1 after taking over a session with expiry 0")
			}
			// No d/# from the old session: the first delivery is on the new
			// subscription.
			store(t, s, []string{"d/0"}, nil)
			c.Subscribe("m/#", 1)
			expectNext(t, c, s, "m/0")
		})
	}
}

// A stored session that a connection with expiry 0 resumed ends with that
// connection too: a takeover does not resume it [MQTT-3.2.2-3].
func TestSessionTakeover_ResumedForOneConnectionEndsWithIt(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 5)
	c.Subscribe("d/#", 1)
	leave(t, b, c)
	once := mqtttest.Dial(t, b.Addr().String(), mqtttest.Connect{ClientID: "dur", Version: 5, Keepalive: 60})
	if !once.Connack.SessionPresent {
		t.Fatal("the stored session was not resumed")
	}
	c = dialDurable(t, b, 5) // takes over once's connection
	if c.Connack.SessionPresent {
		t.Fatal("CONNACK Session Present 1 after taking over a session resumed with expiry 0")
	}
	store(t, s, []string{"d/0"}, nil)
	c.Subscribe("m/#", 1)
	expectNext(t, c, s, "m/0") // no d/0: the old session's d/# is gone
}
