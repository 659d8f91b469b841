package mqtt

import (
	"bytes"
	"log/slog"
	"strings"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Auth decides who may connect and what each connected client may do. The
// broker asks it once per CONNECT; the Access it returns answers every
// later question about that connection. nil (Config.Auth) lets everyone
// do everything, which edge allows only on loopback.
type Auth interface {
	// Authenticate checks what a connecting client presents. It returns
	// the client's access, or false to refuse the CONNECT (MQTT 5 CONNACK
	// 0x86, 3.1.1 return code 4), and why, for the log.
	Authenticate(l Login) (Access, string, bool)
}

// Login is what a connecting client presents.
type Login struct {
	ClientID string
	Username string
	Password []byte
	Remote   string // the remote address, for logs
	// Listener is the name of the listener the client came through
	// (Listener.Name; DefaultListenerName for Config.Listen).
	Listener string
	// CertNames are the names of the client's verified TLS certificate
	// (the subject's CN first, then the DNS and email SANs); empty without
	// one.
	CertNames []string
}

// Access is what one connected client may do. Its methods are called from
// several goroutines at once (the client's, and every delivery reading
// for it), and may change their answers when the rules are reloaded.
type Access interface {
	// MayPublish reports whether the client may publish to topic.
	MayPublish(topic string) bool
	// MaySubscribe reports whether a subscription to filter may be
	// granted: some topic matching it may be readable. Each record is
	// still checked with MayRead.
	MaySubscribe(filter string) bool
	// MayRead reports whether the client may receive a record of topic
	// delivered for its subscription to filter (the filter inside a
	// $replay or $group subscription). An implementation answers at once
	// for a filter that lies wholly inside an allowed one.
	MayRead(filter, topic string) bool
	// MayReadClientID reports whether the client may learn that the
	// client id id published a record it may read: a $replay or $group
	// delivery shows it only when the subscriber asked and this allows
	// (delivery_tap.go, propClient).
	MayReadClientID(id string) bool
	// Tenancy says which groups, client ids and sessions are the
	// client's (tenancy.go).
	Tenancy
}

// Reasons of Denied: what the broker refused because of Auth, or a limit.
const (
	DeniedConnect     = "connect"      // bad credentials
	DeniedPublish     = "publish"      // a publish the ACL refused
	DeniedSubscribe   = "subscribe"    // a subscription no readable topic matches
	DeniedTopicLevels = "topic_levels" // a subscription deeper than max_topic_levels
)

// authHook is the mochi hook that asks Auth. The Access of a connection
// is kept on its connection (corkConn), so it goes with it.
type authHook struct {
	mochi.HookBase
	auth    Auth
	m       *Metrics
	logs    *connLog
	ten     *tenancy        // who owns a client id's session (tenancy.go)
	backoff *loginBackoff   // backoff.go
	done    <-chan struct{} // closed when the broker closes: logins stop waiting
}

var _ mochi.Hook = (*authHook)(nil)

func (h *authHook) ID() string { return "peat-auth" }

func (h *authHook) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck || b == mochi.OnSubscribed
}

// writes: OnPacketEncode runs on a client's write goroutine (panics.go).
func (h *authHook) writes(b byte) bool { return b == mochi.OnPacketEncode }

// OnSubscribed counts and logs the filters of a SUBSCRIBE the ACL refused
// (mochi gives them 0x87). OnACLCheck cannot: for a topic name it does not
// know a subscription from a delivery. Refused $replay and $group filters
// are counted by delivery (prepareTap).
func (h *authHook) OnSubscribed(cl *mochi.Client, pk packets.Packet, reasonCodes []byte) {
	acc := accessOf(cl)
	for i, code := range reasonCodes {
		if code < packets.ErrUnspecifiedError.Code || i >= len(pk.Filters) {
			continue
		}
		f := pk.Filters[i].Filter
		if f == "" || strings.HasPrefix(f, replayPrefix) || strings.HasPrefix(f, groupPrefix) || strings.HasPrefix(f, offsetsPrefix) {
			continue
		}
		// MQTT 3.1.1 has only 0x80 for every refusal: ask again.
		if code != packets.ErrNotAuthorized.Code && (acc == nil || mayReadFilter(acc, sharedFilter(f))) {
			continue
		}
		h.m.Denied.WithLabelValues(DeniedSubscribe).Inc()
		h.logs.denied(DeniedSubscribe, cl.ID, cl.Net.Remote, slog.String(attrFilter, f))
	}
}

// OnPacketEncode gives an MQTT 3.1.1 client refused for its credentials
// return code 4 (bad user name or password): mochi maps MQTT 5's 0x86 to
// 5 (not authorized), which tells a device to give up rather than fix its
// password. Auth's refusals are the only 0x86 mochi sends.
//
// A client refused for its will's topic is not authorized instead: 0x87,
// or 5 for 3.1.1.
func (h *authHook) OnPacketEncode(cl *mochi.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type != packets.Connack || pk.ReasonCode < packets.Err3NotAuthorized.Code {
		return pk
	}
	cc, _ := cl.Net.Conn.(*corkConn)
	if cc != nil {
		if pk, ok := tenancyConnack(cl, cc, pk); ok {
			return pk
		}
	}
	switch {
	case cc != nil && cc.throttled.Load():
		pk.ReasonCode = packets.ErrConnectionRateExceeded.Code // 3.1.1: 3 (connect.go)
		pk.Properties.ReasonString = "too many failed logins: try again later"
	case cc != nil && cc.willDenied.Load() && cl.Properties.ProtocolVersion == 5:
		pk.ReasonCode = packets.ErrNotAuthorized.Code
		pk.Properties.ReasonString = "not authorized to publish to the will topic"
	case cc != nil && cc.willDenied.Load():
	case cl.Properties.ProtocolVersion < 5 && pk.ReasonCode == packets.Err3NotAuthorized.Code:
		pk.ReasonCode = err3BadCredentials
	}
	return pk
}

// err3BadCredentials is MQTT 3.1.1's CONNACK return code 4.
const err3BadCredentials = 0x04

// OnConnectAuthenticate asks Auth and keeps the client's Access on its
// connection.
func (h *authHook) OnConnectAuthenticate(cl *mochi.Client, pk packets.Packet) bool {
	cc, ok := cl.Net.Conn.(*corkConn)
	if !ok { // a connection that did not come through Peat's listener
		return false
	}
	l := Login{
		ClientID:  cl.ID,
		Username:  string(pk.Connect.Username),
		Password:  bytes.Clone(pk.Connect.Password),
		Remote:    cl.Net.Remote,
		Listener:  cl.Net.Listener,
		CertNames: cc.certNames(),
	}
	if !h.waitLogin(cl, cc, l.Username) {
		return false
	}
	acc, why, ok := h.auth.Authenticate(l)
	h.loginDone(cl, l.Username, ok && acc != nil)
	if !ok || acc == nil {
		h.m.Denied.WithLabelValues(DeniedConnect).Inc()
		h.logs.denied(DeniedConnect, cl.ID, cl.Net.Remote, slog.String(attrUser, l.Username), slog.String(attrReason, why))
		return false
	}
	if !h.admit(cl, cc, acc) { // tenancy.go
		return false
	}
	// A last will is a publish made later on the client's behalf (ingest
	// appends it without asking again): its topic is judged now.
	if pk.Connect.WillFlag && !acc.MayPublish(pk.Connect.WillTopic) {
		cc.willDenied.Store(true)
		h.m.Denied.WithLabelValues(DeniedPublish).Inc()
		h.logs.denied(DeniedPublish, cl.ID, cl.Net.Remote, slog.String(attrTopic, pk.Connect.WillTopic),
			slog.String(attrReason, "last will topic"))
		return false
	}
	cc.access.Store(&accessBox{acc})
	return true
}

// OnACLCheck answers mochi's checks: publishes (write), subscriptions
// (read of a filter) and mochi's own deliveries (read of a topic).
func (h *authHook) OnACLCheck(cl *mochi.Client, topic string, write bool) bool {
	if cl.Net.Inline {
		return true // the node's own in-process client
	}
	acc := accessOf(cl)
	var ok bool
	switch {
	case acc == nil:
	case write:
		ok = mayPublishTopic(acc, topic)
		if !ok {
			h.m.Denied.WithLabelValues(DeniedPublish).Inc()
			h.logs.denied(DeniedPublish, cl.ID, cl.Net.Remote, slog.String(attrTopic, topic))
		}
	case strings.HasPrefix(topic, replayPrefix) || strings.HasPrefix(topic, groupPrefix) || strings.HasPrefix(topic, offsetsPrefix):
		// delivery answers: it checks the filter inside, or the group (prepareTap).
	default: // a subscription (refusals are counted in OnSubscribed) or a delivery
		ok = mayReadFilter(acc, sharedFilter(topic)) // mochi asks with $share/<group>/ on
	}
	return ok
}

// mayPublishQuietly is ingest's early check: a publish it does not take
// goes on to mochi, whose own ACL check counts and logs a refusal, so
// this one must not.
func mayPublishQuietly(acl mochi.Hook, cl *mochi.Client, topic string) bool {
	if _, ok := acl.(*authHook); !ok {
		return acl.OnACLCheck(cl, topic, true)
	}
	if cl.Net.Inline {
		return true
	}
	acc := accessOf(cl)
	return acc != nil && mayPublishTopic(acc, topic)
}

// mayReadFilter is the answer OnACLCheck gave mochi for a subscription
// to f.
func mayReadFilter(acc Access, f string) bool {
	if strings.ContainsAny(f, "+#") {
		return acc.MaySubscribe(f)
	}
	return acc.MayRead(f, f)
}

// accessBox holds an Access in an atomic.Pointer.
type accessBox struct{ Access }

// accessOf returns the Access of cl's connection, nil without one.
func accessOf(cl *mochi.Client) Access {
	cc, ok := cl.Net.Conn.(*corkConn)
	if !ok {
		return nil
	}
	if b := cc.access.Load(); b != nil {
		return b.Access
	}
	return nil
}

// certNames returns the names of the client's verified TLS certificate:
// the subject's common name, then its DNS and email SANs; nil without
// TLS or without a client certificate.
func (c *corkConn) certNames() []string {
	gc, ok := c.Conn.(*guardConn)
	if !ok || gc.tc == nil {
		return nil
	}
	st := gc.tc.ConnectionState()
	if len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		return nil
	}
	cert := st.PeerCertificates[0]
	var names []string
	if cert.Subject.CommonName != "" {
		names = append(names, cert.Subject.CommonName)
	}
	names = append(names, cert.DNSNames...)
	return append(names, cert.EmailAddresses...)
}

// readCheck is how delivery asks whether a client may read a record:
// nil when the broker has no Auth (everyone reads everything).
type readCheck func(filter, topic string) bool

// readCheckOf returns cl's read check: nil without Auth, and one that
// refuses everything for a client without Access (never authenticated
// through Peat's listener).
func (d *delivery) readCheckOf(cl *mochi.Client) readCheck {
	if d.auth == nil || cl.Net.Inline {
		return nil
	}
	if acc := accessOf(cl); acc != nil {
		return acc.MayRead
	}
	return func(string, string) bool { return false }
}

// mayReadClientID reports whether c may see id as a record's publisher:
// always without Auth, and for the node's own in-process clients.
func (c *deliveryClient) mayReadClientID(id string) bool {
	if c.d.auth == nil || c.cl.Net.Inline {
		return true
	}
	acc := accessOf(c.cl)
	return acc != nil && acc.MayReadClientID(id)
}

// sharedFilter is the filter of a $share/<group>/<filter> subscription
// (mochi keeps the prefix in its shared subscriptions), or f itself.
func sharedFilter(f string) string {
	if len(f) > len(sharePrefix) && strings.EqualFold(f[:len(sharePrefix)], sharePrefix) {
		if _, rest, ok := strings.Cut(f[len(sharePrefix):], "/"); ok {
			return rest
		}
	}
	return f
}
