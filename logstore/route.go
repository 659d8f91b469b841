package logstore

import (
	"fmt"
	"slices"
	"strings"
)

// Router maps topics to streams through a trie of the streams' filters:
// each topic goes to the stream with the most specific matching filter.
//
// Precedence. Write a filter as its key: one symbol per level, L for a
// literal, P for '+', H for '#', then E after the last level unless that
// level is '#'. Of the filters matching a topic, the one with the smallest
// key wins, comparing keys symbol by symbol with L < P < E < H. So, level
// by level from the left, a literal beats '+', '+' beats '#', and a filter
// ending at the topic's last level beats one going on with "/#"
// ("sensors/kitchen" beats "sensors/kitchen/#" for topic "sensors/kitchen").
// Two different filters matching one topic never have the same key (their
// literals would be the topic's levels at the same places), so the winner
// is unique; the key does not depend on the topic, so the order is one
// total order on filters. Two streams with an equal filter are refused.
//
// A depth-first walk that tries, at each level, the literal child before
// '+' before '#' (and, past the topic's last level, a filter ending there
// before one continuing with '/#') meets the filters in key order, so Route
// stops at the first match: a few map lookups per publish and no
// allocation.
type Router struct {
	root    *routeNode
	filters []routeFilter // every filter, for Reach
	depth   int           // levels of the longest filter
}

// routeFilter is one stream filter and the stream that owns it.
type routeFilter struct {
	filter string
	stream int
}

// noStream marks a trie node where no filter ends.
const noStream = -1

type routeNode struct {
	literal map[string]*routeNode
	plus    *routeNode
	hash    int // stream of a filter ending in '#' at this level
	end     int // stream of a filter ending exactly here
}

func newRouteNode() *routeNode { return &routeNode{hash: noStream, end: noStream} }

// NewRouter builds the router of streams whose filters are filters[i] for
// stream i. Every filter must be valid (ValidateFilter), and no filter may
// belong to two streams.
func NewRouter(filters [][]string) (*Router, error) {
	owner := map[string]int{}
	for i, fs := range filters {
		for _, f := range fs {
			if err := ValidateFilter(f); err != nil {
				return nil, fmt.Errorf("stream %d: %w", i, err)
			}
			if j, ok := owner[f]; ok && j != i {
				return nil, fmt.Errorf("topic filter %q belongs to streams %d and %d", f, j, i)
			}
			owner[f] = i
		}
	}
	return buildRouter(filters), nil
}

// buildRouter builds a router from filters already checked.
func buildRouter(filters [][]string) *Router {
	r := &Router{root: newRouteNode()}
	for i, fs := range filters {
		for _, f := range fs {
			r.add(f, i)
		}
	}
	return r
}

func (r *Router) add(filter string, stream int) {
	r.filters = append(r.filters, routeFilter{filter: filter, stream: stream})
	r.depth = max(r.depth, strings.Count(filter, "/")+1)
	n := r.root
	for rest, more := filter, true; more; {
		var level string
		level, rest, more = strings.Cut(rest, "/")
		switch level {
		case "#":
			n.hash = stream
			return
		case "+":
			if n.plus == nil {
				n.plus = newRouteNode()
			}
			n = n.plus
		default:
			if n.literal == nil {
				n.literal = map[string]*routeNode{}
			}
			c := n.literal[level]
			if c == nil {
				c = newRouteNode()
				n.literal[level] = c
			}
			n = c
		}
	}
	n.end = stream
}

// Route returns the stream with the most specific filter matching topic, or
// -1 when no filter matches. Wildcards at the first level do not match
// topics starting with '$'.
func (r *Router) Route(topic string) int {
	if topic == "" {
		return noStream
	}
	return r.root.match(topic, true, strings.HasPrefix(topic, "$"))
}

// match walks the remaining levels of the topic; more is false once every
// level has been consumed.
func (n *routeNode) match(rest string, more, dollar bool) int {
	if !more {
		if n.end != noStream {
			return n.end
		}
		return n.hash // "a/#" also matches "a"
	}
	level, next, nextMore := strings.Cut(rest, "/")
	if c := n.literal[level]; c != nil {
		if s := c.match(next, nextMore, false); s != noStream {
			return s
		}
	}
	if dollar {
		return noStream
	}
	if n.plus != nil {
		if s := n.plus.match(next, nextMore, false); s != noStream {
			return s
		}
	}
	return n.hash
}

// freshLevel stands for every topic level no filter names: filters hold no
// NUL (ValidateFilter), so it equals no literal, and it does not start
// with '$'.
const freshLevel = "\x00"

// Reach returns, in increasing order, the streams that some topic matching
// filter is routed to: the streams a subscription to filter can receive
// from. filter must be valid (ValidateFilter).
//
// It is exact, and routes a few witness topics per stream filter: for
// each stream filter g and each length n from 1 to N (one more than the
// levels of the longest filter, filter included), the witness W(g, n) has
// n levels, each the literal filter has at that level, else the literal g
// has there, else freshLevel; when W matches both filter and g it is
// routed, and its stream is reached. Why that finds every reached stream
// and nothing else:
//
//   - Sound: W matches filter, and stands for a real topic (freshLevel
//     replaced by any level that no filter names and that does not start
//     with '$' routes alike), so its stream is reached.
//   - Complete: let topic T match filter and be routed to stream S by its
//     winning filter w. If T has more than N levels, filter and w end in
//     '#', and no filter is as long as N levels, so every filter matching T
//     ends in '#' within its first N-1 levels: T cut to N levels matches
//     the same filters, and is routed to S too. So let T have n <= N
//     levels, and W = W(w, n). At each level W holds T's level wherever
//     filter or w names a literal (both match T), and freshLevel
//     elsewhere, where both have a wildcard. A filter h matching W matches
//     T: where W is fresh, h has '+' or '#' (T's level there does not start
//     with '$' at the first level, since filter's wildcard matches it), and
//     elsewhere W equals T. So W matches filter and w, and the filters
//     matching W are among those matching T, of which w comes first in the
//     precedence order (one order for every topic, see Router): w wins W
//     too, and W is routed to S.
//
// Most lengths need no witness (witnessLengths): only those both filter
// and g can match, and, past the longest stream filter, one stands for
// all (the stream filters match all of them alike). So a filter of L
// levels costs O(L) per stream filter and length tried, not O(L^2).
//
// A witness is never the empty topic: n >= 1 and freshLevel is not empty,
// and a one-level witness "" would need the filter "", which is invalid.
func (r *Router) Reach(filter string) []int {
	flevels := strings.Split(filter, "/")
	reached := map[int]bool{}
	var w []string
	for _, g := range r.filters {
		if reached[g.stream] {
			continue
		}
		glevels := strings.Split(g.filter, "/")
		lo, hi := r.witnessLengths(flevels, glevels)
		for n := lo; n <= hi; n++ {
			w = w[:0]
			for i := range n {
				w = append(w, witnessLevel(flevels, glevels, i))
			}
			topic := strings.Join(w, "/")
			if !MatchFilter(filter, topic) || !MatchFilter(g.filter, topic) {
				continue
			}
			if s := r.Route(topic); s != noStream {
				reached[s] = true
			}
		}
	}
	out := make([]int, 0, len(reached))
	for s := range reached {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// witnessLengths returns the lengths of the witnesses of filters a and b
// worth routing: those both can match (a filter ending in '#' matches
// its levels before it and more, another exactly its levels), up to one
// more than the longest stream filter or the shortest of them, whichever
// is higher. Beyond that every witness routes as the last one does: a
// stream filter shorter than the witness matches it only through its
// '#', which does not look past its own levels.
func (r *Router) witnessLengths(a, b []string) (lo, hi int) {
	lo, hi = 1, int(^uint(0)>>1)
	for _, f := range [2][]string{a, b} {
		n := len(f)
		if f[n-1] == "#" {
			lo = max(lo, n-1)
		} else {
			lo, hi = max(lo, n), min(hi, n)
		}
	}
	return lo, min(hi, max(lo, r.depth)+1)
}

// witnessLevel is level i of a witness for filters a and b: a's literal
// there, else b's, else freshLevel.
func witnessLevel(a, b []string, i int) string {
	for _, f := range [2][]string{a, b} {
		if i < len(f) && f[i] != "+" && f[i] != "#" {
			return f[i]
		}
	}
	return freshLevel
}

// router is the store's Router, answering with streams.
type router struct {
	r       *Router
	streams []*Stream
}

func newRouter(streams []*Stream) *router {
	filters := make([][]string, len(streams))
	for i, s := range streams {
		filters[i] = s.cfg.Filters
	}
	// Config.Validate checked the filters and that no two streams share one.
	return &router{r: buildRouter(filters), streams: streams}
}

func (r *router) route(topic string) *Stream {
	if i := r.r.Route(topic); i != noStream {
		return r.streams[i]
	}
	return nil
}

// Reach returns the streams that some topic matching filter is routed to,
// in config order (Router.Reach). filter must be valid (ValidateFilter).
func (st *Store) Reach(filter string) []*Stream {
	rt := st.set.Load().router // one snapshot: indexes and streams agree
	idx := rt.r.Reach(filter)
	out := make([]*Stream, len(idx))
	for i, s := range idx {
		out[i] = rt.streams[s]
	}
	return out
}
