package mqtt

import (
	mochi "github.com/mochi-mqtt/server/v2"
)

// A session whose expiry is 0 (MQTT 3.1.1: clean session) ends when its
// network connection closes (MQTT 5 3.1.2.11.2), and a takeover closes
// it: the connection that takes it over, even with Clean Start 0, starts
// a new session, with Session Present 0 in its CONNACK [MQTT-3.2.2-3].
// mochi v2.7.9 gets this right for an MQTT 3.1.1 clean session only; for
// MQTT 5 it hands the new connection the old one's subscriptions and
// inflight messages and answers Session Present 1.

// endTakenOver ends the session of old, a live connection that cl takes
// over, when it ends with old's connection; it runs in OnSessionEstablish,
// before mochi's inheritClientSession, which then finds nothing to hand
// on. The CONNACK learns it from cl's connection (connect.go).
func (d *delivery) endTakenOver(cl, old *mochi.Client) {
	if cl.Properties.Clean || persistent(old) {
		return // a new session anyway, or one that outlives old
	}
	d.sessions.endTransient(old)
	d.srv.UnsubscribeClient(old)
	old.ClearInflights()
	if cc, ok := cl.Net.Conn.(*corkConn); ok {
		cc.sessionEnded.Store(true)
	}
}

// endTransient ends the stored session old resumed for its connection
// only (Clean Start 0, expiry 0): it ends with that connection.
func (ss *sessions) endTransient(old *mochi.Client) {
	ss.mu.Lock()
	s := ss.m[old.ID]
	mine := s != nil && s.conn == old && s.transient
	ss.mu.Unlock()
	if mine {
		ss.expire(old.ID)
	}
}
