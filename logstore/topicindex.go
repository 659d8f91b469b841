package logstore

import "strings"

// Two indexes built on the rules of MatchFilter (filter.go), for the places
// that match one filter against many topics or one topic against many
// filters: a TopicSet finds the topics a filter matches (retained
// messages for a new subscription), a FilterIndex the filters a topic
// matches (live delivery). Both are tries of levels, so a lookup costs
// what the levels it walks cost, with no level parsed twice: linear in the
// length of the topic or filter, plus what it finds (and, for '+' in a
// filter, the children it tries). MatchFilter is the specification; a
// fuzz test holds both to it. Neither is safe for concurrent use.

// TopicSet is a set of topic names.
type TopicSet struct {
	root topicNode
	n    int
}

type topicNode struct {
	parent   *topicNode
	level    string
	children map[string]*topicNode
	topic    string // the topic that ends here, when present
	present  bool
}

// Len returns the number of topics in the set.
func (s *TopicSet) Len() int { return s.n }

// Add puts topic in the set.
func (s *TopicSet) Add(topic string) {
	n := &s.root
	for rest, more := topic, true; more; {
		var level string
		level, rest, more = strings.Cut(rest, "/")
		c := n.children[level]
		if c == nil {
			if n.children == nil {
				n.children = map[string]*topicNode{}
			}
			c = &topicNode{parent: n, level: level}
			n.children[level] = c
		}
		n = c
	}
	if !n.present {
		n.present, n.topic = true, topic
		s.n++
	}
}

// Remove takes topic out of the set, and the nodes it alone needed.
func (s *TopicSet) Remove(topic string) {
	n := &s.root
	for rest, more := topic, true; more && n != nil; {
		var level string
		level, rest, more = strings.Cut(rest, "/")
		n = n.children[level]
	}
	if n == nil || !n.present {
		return
	}
	n.present, n.topic = false, ""
	s.n--
	for n.parent != nil && !n.present && len(n.children) == 0 {
		delete(n.parent.children, n.level)
		n = n.parent
	}
}

// Match calls fn with every topic of the set that filter matches, in no
// particular order. filter must be valid (ValidateFilter).
func (s *TopicSet) Match(filter string, fn func(topic string)) {
	if s.n > 0 {
		s.root.match(filter, true, fn)
	}
}

// match matches the rest of a filter below n; first is true at the root,
// where wildcards do not match levels starting with '$' [MQTT-4.7.2-1].
func (n *topicNode) match(filter string, first bool, fn func(string)) {
	for {
		level, rest, more := strings.Cut(filter, "/")
		switch level {
		case "#":
			if n.present { // "a/#" matches "a" [MQTT-4.7.1-2]
				fn(n.topic)
			}
			for l, c := range n.children {
				if !first || !strings.HasPrefix(l, "$") {
					c.all(fn)
				}
			}
			return
		case "+":
			for l, c := range n.children {
				if first && strings.HasPrefix(l, "$") {
					continue
				}
				if !more {
					c.emit(fn)
				} else {
					c.match(rest, false, fn)
				}
			}
			return
		}
		c := n.children[level]
		if c == nil {
			return
		}
		if !more {
			c.emit(fn)
			return
		}
		n, filter, first = c, rest, false
	}
}

// emit calls fn with the topic ending at n, if any: the filter ended
// at n's level.
func (n *topicNode) emit(fn func(string)) {
	if n.present {
		fn(n.topic)
	}
}

// all calls fn with every topic at or below n.
func (n *topicNode) all(fn func(string)) {
	if n.present {
		fn(n.topic)
	}
	for _, c := range n.children {
		c.all(fn)
	}
}

// FilterIndex holds filters, each with any number of values: the
// subscriptions made to it, say.
type FilterIndex[V comparable] struct {
	root filterNode[V]
}

type filterNode[V comparable] struct {
	parent  *filterNode[V]
	level   string
	literal map[string]*filterNode[V]
	plus    *filterNode[V]
	hash    *filterNode[V] // the filter that ends here with "/#"
	filter  string
	values  map[V]struct{}
}

// Add adds value to filter's values. filter must be valid
// (ValidateFilter).
func (x *FilterIndex[V]) Add(filter string, value V) {
	n := &x.root
	for rest, more := filter, true; more; {
		var level string
		level, rest, more = strings.Cut(rest, "/")
		n = n.child(level)
	}
	if n.values == nil {
		n.values, n.filter = map[V]struct{}{}, filter
	}
	n.values[value] = struct{}{}
}

// child returns n's child for level, made when missing.
func (n *filterNode[V]) child(level string) *filterNode[V] {
	var c **filterNode[V]
	switch level {
	case "+":
		c = &n.plus
	case "#":
		c = &n.hash
	default:
		if n.literal == nil {
			n.literal = map[string]*filterNode[V]{}
		}
		if l := n.literal[level]; l != nil {
			return l
		}
		l := &filterNode[V]{parent: n, level: level}
		n.literal[level] = l
		return l
	}
	if *c == nil {
		*c = &filterNode[V]{parent: n, level: level}
	}
	return *c
}

// Remove takes value from filter's values, and drops the nodes no filter
// needs any more.
func (x *FilterIndex[V]) Remove(filter string, value V) {
	n := &x.root
	for rest, more := filter, true; more && n != nil; {
		var level string
		level, rest, more = strings.Cut(rest, "/")
		switch level {
		case "+":
			n = n.plus
		case "#":
			n = n.hash
		default:
			n = n.literal[level]
		}
	}
	if n == nil {
		return
	}
	delete(n.values, value)
	for n.parent != nil && len(n.values) == 0 && len(n.literal) == 0 && n.plus == nil && n.hash == nil {
		p := n.parent
		switch {
		case p.plus == n:
			p.plus = nil
		case p.hash == n:
			p.hash = nil
		default:
			delete(p.literal, n.level)
		}
		n = p
	}
}

// Match calls fn with each filter that topic matches and each of its
// values. topic must be a topic name: not empty, no wildcards.
func (x *FilterIndex[V]) Match(topic string, fn func(filter string, value V)) {
	if topic == "" {
		return
	}
	x.root.match(topic, true, strings.HasPrefix(topic, "$"), fn)
}

// match matches the rest of a topic below n: wildcards at the first level
// skip a topic starting with '$' [MQTT-4.7.2-1].
func (n *filterNode[V]) match(topic string, first, dollar bool, fn func(string, V)) {
	for {
		wild := !(first && dollar)
		if wild && n.hash != nil { // "a/#" matches "a" and all below it
			n.hash.emit(fn)
		}
		level, rest, more := strings.Cut(topic, "/")
		if wild && n.plus != nil {
			if more {
				n.plus.match(rest, false, dollar, fn)
			} else {
				n.plus.emitEnd(fn)
			}
		}
		c := n.literal[level]
		if c == nil {
			return
		}
		if !more {
			c.emitEnd(fn)
			return
		}
		n, topic, first = c, rest, false
	}
}

// emitEnd reports the filters a topic ending at n matches: the one
// ending here, and the one ending here with "/#".
func (n *filterNode[V]) emitEnd(fn func(string, V)) {
	n.emit(fn)
	if n.hash != nil {
		n.hash.emit(fn)
	}
}

func (n *filterNode[V]) emit(fn func(string, V)) {
	for v := range n.values {
		fn(n.filter, v)
	}
}
