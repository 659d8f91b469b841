package logstore

import "strings"

// router maps topics to streams through a trie of the streams' filters.
// A depth-first walk that tries, at each level, the literal child before
// '+' before '#' (and, past the topic's last level, a filter ending there
// before one continuing with '/#') meets the most specific filter first, so
// Route stops at the first match: a few map lookups per publish and no
// allocation.
type router struct {
	root *routeNode
}

type routeNode struct {
	literal map[string]*routeNode
	plus    *routeNode
	hash    *Stream // a filter ending in '#' at this level
	end     *Stream // a filter ending exactly here
}

func newRouter(streams []*Stream) *router {
	r := &router{root: &routeNode{}}
	for _, s := range streams {
		for _, f := range s.cfg.Filters {
			r.add(f, s)
		}
	}
	return r
}

func (r *router) add(filter string, s *Stream) {
	n := r.root
	for rest, more := filter, true; more; {
		var level string
		level, rest, more = strings.Cut(rest, "/")
		switch level {
		case "#":
			n.hash = s
			return
		case "+":
			if n.plus == nil {
				n.plus = &routeNode{}
			}
			n = n.plus
		default:
			if n.literal == nil {
				n.literal = map[string]*routeNode{}
			}
			c := n.literal[level]
			if c == nil {
				c = &routeNode{}
				n.literal[level] = c
			}
			n = c
		}
	}
	n.end = s
}

// route returns the stream with the most specific filter matching topic.
// Wildcards at the first level do not match topics starting with '$'.
func (r *router) route(topic string) *Stream {
	if topic == "" {
		return nil
	}
	return r.root.match(topic, true, strings.HasPrefix(topic, "$"))
}

// match walks the remaining levels of the topic; more is false once every
// level has been consumed.
func (n *routeNode) match(rest string, more, dollar bool) *Stream {
	if !more {
		if n.end != nil {
			return n.end
		}
		return n.hash // "a/#" also matches "a"
	}
	level, next, nextMore := strings.Cut(rest, "/")
	if c := n.literal[level]; c != nil {
		if s := c.match(next, nextMore, false); s != nil {
			return s
		}
	}
	if dollar {
		return nil
	}
	if n.plus != nil {
		if s := n.plus.match(next, nextMore, false); s != nil {
			return s
		}
	}
	return n.hash
}
