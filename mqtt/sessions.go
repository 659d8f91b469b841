package mqtt

import (
	"fmt"
	"strings"
	"sync"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/vmihailenco/msgpack/v5"
)

// Durable sessions.
//
// A client with a persistent session (MQTT 3 clean session false, MQTT 5
// session expiry above 0) is backed by a cursor per stream, not by an
// in-memory queue: Peat keeps, per stream, the offset below which every
// record was acknowledged by the client or not for it (its progress), and
// when the client comes back, after a disconnect or a broker restart, it
// reads each stream from there. What it missed is bounded by retention,
// not by memory or by mochi's inflight limit.
//
// The session (client properties, subscriptions, offsets) is kept in the
// StateStore under "s/<client id>", msgpack-encoded, and given to mochi at
// start through the storage hooks StoredClients and StoredSubscriptions, so
// the client finds its session present after a restart. Offsets follow
// acknowledgements in memory at once and reach the store within the state
// writer's interval, and at once when the client disconnects: a broker
// killed with kill -9 delivers again at most that interval's worth of
// acknowledged messages (at least once, never lost).
//
// Shared subscriptions ($share) are not resumed from the log: their
// records go to whichever member is connected. A session that expires
// releases its cursor and its subscriptions.
//
// Which session a connection gets, and how long it lasts, follow MQTT 5
// 3.1.2.4 and 3.1.2.11.2: Clean Start 1 (clean session, v3) ends the stored
// session and starts a new one; Clean Start 0 resumes the stored session
// whatever this connection's Session Expiry Interval says (paho's Python
// client reconnects with none). The expiry only decides what happens when
// this connection ends: 0 or absent (v3: clean session) ends the session
// then, and such a session is not kept in the store meanwhile (a crash ends
// the connection too); above 0 keeps it. A v5 DISCONNECT may lower it to 0.

// sessionStatePrefix starts every durable session's state key.
const sessionStatePrefix = "s/"

// tapOffsetKey is a session offset's key for an extension subscription's
// own cursor ($replay taps), as opposed to a stream name.
func tapOffsetKey(filter string) string { return "$tap:" + filter }

// sessionSub is a stored subscription.
type sessionSub struct {
	Filter            string `msgpack:"f"`
	Qos               byte   `msgpack:"q"`
	NoLocal           bool   `msgpack:"nl,omitempty"`
	RetainAsPublished bool   `msgpack:"rap,omitempty"`
	RetainHandling    byte   `msgpack:"rh,omitempty"`
	Identifier        int    `msgpack:"id,omitempty"`
}

// session is one durable session.
type session struct {
	ProtocolVersion byte                  `msgpack:"v"`
	Username        []byte                `msgpack:"u,omitempty"`
	Listener        string                `msgpack:"l,omitempty"`
	Clean           bool                  `msgpack:"c,omitempty"`
	Expiry          uint32                `msgpack:"e,omitempty"`
	ExpiryFlag      bool                  `msgpack:"ef,omitempty"`
	ReceiveMaximum  uint16                `msgpack:"rm,omitempty"`
	Subs            map[string]sessionSub `msgpack:"s"`
	// Offsets are where the client resumes: by stream name for its plain
	// subscriptions, by tapOffsetKey for its $replay subscriptions.
	Offsets map[string]uint64 `msgpack:"o"`

	// conn is the connection that holds the session (nil while none does):
	// when an earlier connection of the same client id ends, it must not
	// end a session a newer connection took over.
	conn *mochi.Client `msgpack:"-"`
	// transient: the session ends with conn (its expiry is 0); it is not
	// in the store.
	transient bool `msgpack:"-"`
}

// sessions is the registry of durable sessions.
type sessions struct {
	w *stateWriter

	mu sync.Mutex
	m  map[string]*session // by client id
}

func newSessions() *sessions { return &sessions{m: map[string]*session{}} }

// persistent reports whether cl's session outlives its connection: a v5
// Session Expiry Interval above 0, or a v3 clean session false. It does not
// decide whether cl resumes a stored session; Clean Start does.
func persistent(cl *mochi.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryIntervalFlag && cl.Properties.Props.SessionExpiryInterval > 0
	}
	return !cl.Properties.Clean
}

// load reads every stored session.
func (ss *sessions) load(st StateStore) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return st.LoadState(sessionStatePrefix, func(k string, v []byte) error {
		var s session
		if err := msgpack.Unmarshal(v, &s); err != nil {
			return fmt.Errorf("session %q: %w", k, err)
		}
		if s.Subs == nil {
			s.Subs = map[string]sessionSub{}
		}
		if s.Offsets == nil {
			s.Offsets = map[string]uint64{}
		}
		ss.m[strings.TrimPrefix(k, sessionStatePrefix)] = &s
		return nil
	})
}

// save writes the session of id as it is when the writer gets to it; urgent
// writes it at once.
func (ss *sessions) save(id string, urgent bool) {
	var done func(error)
	if urgent {
		done = func(error) {}
	}
	ss.w.putFunc(sessionStatePrefix+id, func() []byte {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		s := ss.m[id]
		if s == nil || s.transient {
			return nil // deleted meanwhile, or not to be kept
		}
		b, err := msgpack.Marshal(s)
		if err != nil { // cannot happen for this struct
			panic(fmt.Sprintf("mqtt: encode session %q: %v", id, err))
		}
		return b
	}, done)
}

// claim hands the stored session of a client that connects with Clean
// Start 0 to the new connection cl. It runs in OnSessionEstablish, before
// mochi disconnects the client's earlier connection, so that connection's
// end does not end the session the new one resumes.
func (ss *sessions) claim(cl *mochi.Client) {
	if cl.Properties.Clean {
		return
	}
	ss.mu.Lock()
	if s := ss.m[cl.ID]; s != nil {
		s.conn = cl
	}
	ss.mu.Unlock()
}

// establish records the session of a client that just connected, with the
// subscriptions mochi gave it, and returns its stored offsets (nil when it
// has no session beyond its connection). Clean Start ends a stored session;
// without it the stored session resumes, kept past this connection only if
// the connection is persistent.
func (ss *sessions) establish(cl *mochi.Client) map[string]uint64 {
	ss.mu.Lock()
	s := ss.m[cl.ID]
	ended := false
	if s != nil && cl.Properties.Clean {
		delete(ss.m, cl.ID) // [MQTT-3.1.2-4]: a new session, not the old offsets
		s, ended = nil, true
	}
	if s == nil && !persistent(cl) {
		ss.mu.Unlock()
		if ended {
			ss.save(cl.ID, true)
		}
		return nil
	}
	if s == nil {
		s = &session{Offsets: map[string]uint64{}}
		ss.m[cl.ID] = s
	}
	s.conn = cl
	s.transient = !persistent(cl) // resumed, but it ends with this connection
	s.ProtocolVersion = cl.Properties.ProtocolVersion
	s.Username = cl.Properties.Username
	s.Listener = cl.Net.Listener
	s.Clean = cl.Properties.Clean
	s.Expiry = cl.Properties.Props.SessionExpiryInterval
	s.ExpiryFlag = cl.Properties.Props.SessionExpiryIntervalFlag
	s.ReceiveMaximum = cl.Properties.Props.ReceiveMaximum
	s.Subs = map[string]sessionSub{}
	for _, sub := range cl.State.Subscriptions.GetAll() {
		s.Subs[sub.Filter] = sessionSubOf(sub)
	}
	offsets := make(map[string]uint64, len(s.Offsets))
	for k, v := range s.Offsets {
		offsets[k] = v
	}
	ss.mu.Unlock()
	ss.save(cl.ID, true) // a transient session is taken out of the store
	return offsets
}

// held reports whether cl holds a session that resumes from the log.
func (ss *sessions) held(cl *mochi.Client) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[cl.ID]
	return s != nil && s.conn == cl
}

func sessionSubOf(sub packets.Subscription) sessionSub {
	return sessionSub{
		Filter: sub.Filter, Qos: sub.Qos, NoLocal: sub.NoLocal,
		RetainAsPublished: sub.RetainAsPublished, RetainHandling: sub.RetainHandling,
		Identifier: sub.Identifier,
	}
}

// subscribed and unsubscribed follow a durable client's subscriptions.
func (ss *sessions) subscribed(id string, subs []packets.Subscription) {
	ss.mu.Lock()
	s := ss.m[id]
	if s != nil {
		for _, sub := range subs {
			s.Subs[sub.Filter] = sessionSubOf(sub)
		}
	}
	ss.mu.Unlock()
	if s != nil {
		ss.save(id, true)
	}
}

func (ss *sessions) unsubscribed(id string, filters []string) {
	ss.mu.Lock()
	s := ss.m[id]
	if s != nil {
		for _, f := range filters {
			delete(s.Subs, f)
			delete(s.Offsets, tapOffsetKey(f))
		}
	}
	ss.mu.Unlock()
	if s != nil {
		ss.save(id, true)
	}
}

// advance sets where the client resumes in a stream (or a tap). A
// transient session's position is not written: it is not in the store.
func (ss *sessions) advance(id, key string, off uint64) {
	ss.mu.Lock()
	s := ss.m[id]
	keep := s != nil && !s.transient
	if s != nil {
		s.Offsets[key] = off
	}
	ss.mu.Unlock()
	if keep {
		ss.save(id, false)
	}
}

// offset returns where the client resumes for key, if it has a stored one.
func (ss *sessions) offset(id, key string) (uint64, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[id]
	if s == nil {
		return 0, false
	}
	off, ok := s.Offsets[key]
	return off, ok
}

// disconnected ends or writes the session cl held when its connection
// ended. expire is mochi's verdict from the connection's final Session
// Expiry Interval (a v5 DISCONNECT may have changed it) or clean session.
// A connection that a newer one took over leaves the session alone.
func (ss *sessions) disconnected(cl *mochi.Client, expire bool) {
	ss.mu.Lock()
	s := ss.m[cl.ID]
	if s == nil || (s.conn != nil && s.conn != cl) {
		ss.mu.Unlock()
		return
	}
	if expire {
		delete(ss.m, cl.ID)
	} else {
		s.conn = nil
		s.transient = false
		s.Expiry = cl.Properties.Props.SessionExpiryInterval
		s.ExpiryFlag = cl.Properties.Props.SessionExpiryIntervalFlag
	}
	ss.mu.Unlock()
	ss.save(cl.ID, true)
}

// expire ends a session.
func (ss *sessions) expire(id string) {
	ss.mu.Lock()
	_, ok := ss.m[id]
	delete(ss.m, id)
	ss.mu.Unlock()
	if ok {
		ss.save(id, true)
	}
}

// stored returns the sessions as mochi's storage records.
func (ss *sessions) stored() ([]storage.Client, []storage.Subscription) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var clients []storage.Client
	var subs []storage.Subscription
	for id, s := range ss.m {
		clients = append(clients, storage.Client{
			ID:              id,
			T:               storage.ClientKey,
			Listener:        s.Listener,
			Username:        s.Username,
			Clean:           s.Clean,
			ProtocolVersion: s.ProtocolVersion,
			Properties: storage.ClientProperties{
				SessionExpiryInterval:     s.Expiry,
				SessionExpiryIntervalFlag: s.ExpiryFlag,
				ReceiveMaximum:            s.ReceiveMaximum,
			},
		})
		for _, sub := range s.Subs {
			subs = append(subs, storage.Subscription{
				ID: id + ":" + sub.Filter, T: storage.SubscriptionKey, Client: id,
				Filter: sub.Filter, Qos: sub.Qos, NoLocal: sub.NoLocal,
				RetainAsPublished: sub.RetainAsPublished, RetainHandling: sub.RetainHandling,
				Identifier: sub.Identifier,
			})
		}
	}
	return clients, subs
}
