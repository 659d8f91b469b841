package sitetest

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest/rawmqtt"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// An MQTT 5 client with a Session Expiry Interval of 3 s is connected and
// subscribed to a node that is killed with kill -9. A surviving node
// expires the session once the interval has passed since the site saw
// the node go, with no client connecting (it counts it in
// peat_mqtt_sessions_expired_total), and the client back on another node
// finds no session.
func TestSite_OrphanedSessionExpires(t *testing.T) {
	needSite(t)
	st := streamSpec{"load", "load/#"}
	s := newSite(t, 3, st)
	home, rest := s.nodes[1], []*node{s.nodes[0], s.nodes[2]}
	var c *conn
	testwait.EventuallyWithin(t, wait(60*time.Second), "a v5 session on "+home.id, func() bool {
		var err error
		c, _, err = dialExpiring(home.mqtt, "orphan-1", 3)
		return err == nil
	})
	if err := c.subscribe(st.filter, 1); err != nil {
		t.Fatal(err)
	}
	home.kill()
	testwait.EventuallyWithin(t, wait(90*time.Second), "a surviving node to expire the dead node's session", func() bool {
		var n float64
		for _, nd := range rest {
			n += nd.metric(t, "peat_mqtt_sessions_expired_total")
		}
		return n >= 1
	})
	var present bool
	testwait.EventuallyWithin(t, wait(60*time.Second), "the client back on "+rest[0].id, func() bool {
		c, p, err := dialExpiring(rest[0].mqtt, "orphan-1", 3)
		if err != nil {
			return false
		}
		c.close()
		present = p
		return true
	})
	if present {
		t.Fatal("the session expired by the site is present on another node")
	}
}

// dialExpiring connects an MQTT 5 client with Clean Start 0 and Session
// Expiry Interval expiry, and returns the CONNACK's session present.
func dialExpiring(addr, id string, expiry uint32) (*conn, bool, error) {
	c, err := dialConnect(addr, rawmqtt.Connect{ClientID: id, Version: 5, Keepalive: 60,
		Properties: packets.Properties{SessionExpiryInterval: expiry, SessionExpiryIntervalFlag: true, ReceiveMaximum: 64}},
		30*time.Second) // a claim waits for a failing-over leader
	if err != nil {
		return nil, false, err
	}
	return c, c.Connack().SessionPresent, nil
}

// metric is the value of an unlabelled series on the node's /metrics, 0
// when the node does not answer or has no such series.
func (nd *node) metric(t *testing.T, name string) float64 {
	t.Helper()
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + nd.http + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatalf("%s on %s: %v", name, nd.id, err)
	}
	return v
}
