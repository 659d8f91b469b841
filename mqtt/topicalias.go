package mqtt

import (
	"strings"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Topic aliases toward MQTT 5 clients (MQTT 5 3.3.2.3.4).
//
// A client that offers a Topic Alias Maximum in CONNECT lets the server
// send a topic once with an alias, and later only the alias. Each delivery
// connection gets a table of min(client's maximum, Config.TopicAliases)
// aliases; the first PUBLISH of a topic carries the topic and its alias,
// the next ones an empty topic and the alias. The table belongs to the
// connection: a reconnect starts a new one, and what is delivered again
// after a reconnect is a new PUBLISH that carries its topic. Peat keeps no
// packet to resend (packetid.go), so none can hold an empty topic.
//
// When the table is full, the least recently used alias is given to the new
// topic (the PUBLISH carries the topic, which rebinds the alias at the
// client). Keeping the first topics for the whole connection instead would
// pin aliases to topics that stopped (sensors come and go on a long-lived
// connection); with eviction the table follows what the client receives
// now. The worst case, more topics cycling than aliases, costs the alias
// property (3 bytes) on each PUBLISH.
//
// Only plain deliveries are aliased: a $replay or $group delivery's topic
// holds its offset and never repeats. Topics of 3 bytes or less are not:
// the alias saves nothing. mochi's own outbound aliases are switched off
// (ownTopicAliases): its table would hand out the same numbers for other
// topics, and its deliveries leave through its outbound channel, so an alias
// it assigns could reach the client after a Peat PUBLISH that uses it.

// aliasPropLen is the length of a Topic Alias property.
const aliasPropLen = 3

// ownTopicAliases switches mochi's outbound topic aliases off for cl, so
// the client's alias numbers are Peat's alone. It runs in
// OnSessionEstablish, before any other goroutine can deliver to cl.
func ownTopicAliases(cl *mochi.Client) {
	cl.State.TopicAliases.Outbound = mochi.NewOutboundTopicAliases(0)
}

// topicAliases is one connection's alias table, used by its sender
// goroutine only: topics by alias in least recently used order.
type topicAliases struct {
	max     int
	byTopic map[string]*aliasSlot
	// head is the most recently used slot, tail the least.
	head, tail *aliasSlot
	free       []uint16 // aliases given back by forget
	next       uint16   // the next alias never handed out
}

type aliasSlot struct {
	topic      string
	alias      uint16
	prev, next *aliasSlot
}

// newTopicAliases returns a table of max aliases, nil for none.
func newTopicAliases(max int) *topicAliases {
	if max <= 0 {
		return nil
	}
	return &topicAliases{max: min(max, 65535), byTopic: map[string]*aliasSlot{}, next: 1}
}

// apply gives pk, a plain delivery, its topic alias: the alias alone when
// the client knows it, else the topic and the alias. It returns whether pk
// binds a new alias, which forget must undo if pk is not sent.
func (a *topicAliases) apply(pk *packets.Packet) (binds bool) {
	if a == nil || len(pk.TopicName) <= aliasPropLen {
		return false
	}
	alias, known := a.use(pk.TopicName)
	pk.Properties.TopicAlias, pk.Properties.TopicAliasFlag = alias, true
	if known {
		pk.TopicName = ""
	}
	return !known
}

// use returns topic's alias and whether the client already has it.
func (a *topicAliases) use(topic string) (alias uint16, known bool) {
	if s := a.byTopic[topic]; s != nil {
		a.unlink(s)
		a.pushFront(s)
		return s.alias, true
	}
	var s *aliasSlot
	switch {
	case len(a.free) > 0:
		s = &aliasSlot{alias: a.free[len(a.free)-1]}
		a.free = a.free[:len(a.free)-1]
	case int(a.next) <= a.max:
		s = &aliasSlot{alias: a.next}
		a.next++
	default: // full: the least recently used alias goes to topic
		s = a.tail
		a.unlink(s)
		delete(a.byTopic, s.topic)
	}
	s.topic = strings.Clone(topic) // not a reference into a record's memory
	a.byTopic[s.topic] = s
	a.pushFront(s)
	return s.alias, false
}

// forget drops topic's alias, whose binding PUBLISH was not sent.
func (a *topicAliases) forget(topic string) {
	s := a.byTopic[topic]
	if s == nil {
		return
	}
	a.unlink(s)
	delete(a.byTopic, topic)
	a.free = append(a.free, s.alias)
}

func (a *topicAliases) unlink(s *aliasSlot) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		a.head = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	} else {
		a.tail = s.prev
	}
	s.prev, s.next = nil, nil
}

func (a *topicAliases) pushFront(s *aliasSlot) {
	s.next = a.head
	if a.head != nil {
		a.head.prev = s
	}
	a.head = s
	if a.tail == nil {
		a.tail = s
	}
}
