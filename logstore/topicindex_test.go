package logstore

import (
	"slices"
	"strings"
	"testing"
)

// specPairs are MQTT 5 §4.7's examples, and the corners around them, as
// "filter topic" lines: the seed corpus of FuzzTopicIndexes.
var specPairs = [][2]string{
	{"sport/tennis/player1/#", "sport/tennis/player1"},
	{"sport/tennis/player1/#", "sport/tennis/player1/ranking"},
	{"sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon"},
	{"sport/#", "sport"},
	{"sport/tennis/+", "sport/tennis/player1/ranking"},
	{"sport/+", "sport"}, {"sport/+", "sport/"},
	{"+/+", "/finance"}, {"/+", "/finance"}, {"+", "/finance"},
	{"#", "$SYS/x"}, {"+/monitor/Clients", "$SYS/monitor/Clients"},
	{"$SYS/#", "$SYS"}, {"$SYS/monitor/+", "$SYS/monitor/Clients"},
	{"a/b/#", "a/b"}, {"+/+/#", "a/b"}, {"foo/+/baz/#", "foo/x/baz"},
	{"foo//baz", "foo//baz"}, {"foo/+/baz", "foo//baz"}, {"+/#", "a"},
	{"a/+", "a/$x"}, {"#", "/"}, {"/#", "/"}, {"+/+/+", "a//"},
}

// indexesAgree checks that a TopicSet of topics and a FilterIndex of
// filters find exactly the pairs the reference matcher says match.
func indexesAgree(t *testing.T, filters, topics []string) {
	t.Helper()
	var set TopicSet
	for _, tp := range topics {
		set.Add(tp)
	}
	var idx FilterIndex[int]
	for i, f := range filters {
		idx.Add(f, i)
	}
	for _, f := range filters {
		var got []string
		set.Match(f, func(tp string) { got = append(got, tp) })
		var want []string
		for _, tp := range topics {
			if refMatch(f, tp) && !slices.Contains(want, tp) {
				want = append(want, tp)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("TopicSet.Match(%q) = %q, the spec says %q", f, got, want)
		}
	}
	for _, tp := range topics {
		var got []int
		idx.Match(tp, func(f string, i int) {
			if filters[i] != f {
				t.Fatalf("FilterIndex reports filter %q for value %d, added with %q", f, i, filters[i])
			}
			got = append(got, i)
		})
		var want []int
		for i, f := range filters {
			if refMatch(f, tp) {
				want = append(want, i)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("FilterIndex.Match(%q) = %v, the spec says %v (filters %q)", tp, got, want, filters)
		}
	}
}

func TestTopicIndexes_SpecExamples(t *testing.T) {
	var filters, topics []string
	for _, p := range specPairs {
		filters = append(filters, p[0])
		topics = append(topics, p[1])
	}
	indexesAgree(t, filters, topics)
}

// Removing a topic or a filter's value drops it from what Match finds, and
// the nodes only it needed.
func TestTopicIndexes_Remove(t *testing.T) {
	var set TopicSet
	set.Add("a/b")
	set.Add("a/b/c")
	set.Remove("a/b/c")
	set.Remove("a/x") // not there: no effect
	var got []string
	set.Match("#", func(tp string) { got = append(got, tp) })
	if !slices.Equal(got, []string{"a/b"}) || set.Len() != 1 {
		t.Fatalf("after removing a/b/c: %q (len %d), want [a/b]", got, set.Len())
	}
	set.Remove("a/b")
	if len(set.root.children) != 0 {
		t.Fatalf("an empty set keeps nodes: %v", set.root.children)
	}

	var idx FilterIndex[string]
	idx.Add("a/+/#", "c1")
	idx.Add("a/+/#", "c2")
	idx.Remove("a/+/#", "c1")
	var vals []string
	idx.Match("a/b", func(_ string, v string) { vals = append(vals, v) })
	if !slices.Equal(vals, []string{"c2"}) {
		t.Fatalf("after removing c1: %q, want [c2]", vals)
	}
	idx.Remove("a/+/#", "c2")
	if idx.root.literal["a"] != nil {
		t.Fatal("an empty index keeps nodes")
	}
}

// FuzzTopicIndexes holds TopicSet and FilterIndex to the reference
// matcher: the input is filters and topics, one per line.
func FuzzTopicIndexes(f *testing.F) {
	for _, p := range specPairs {
		f.Add(p[0] + "\n" + p[1])
	}
	f.Add("a/#\n+/+/#\na\na/b\n$x/#\n$x\n$x/y")
	f.Fuzz(func(t *testing.T, in string) {
		var filters, topics []string
		for _, l := range strings.Split(in, "\n") {
			if ValidateFilter(l) == nil {
				filters = append(filters, l)
			}
			if validTopic(l) {
				topics = append(topics, l)
			}
		}
		indexesAgree(t, filters, topics)
	})
}

// deepLevels is n levels of level, joined by '/'.
func deepLevels(level string, n int) string {
	return strings.TrimSuffix(strings.Repeat(level+"/", n), "/")
}

// BenchmarkTopicIndexes_Deep matches a 20,000-level filter against a set
// holding a topic that deep, and such a topic against an index holding
// the filter: linear in the length, so microseconds per lookup.
func BenchmarkTopicIndexes_Deep(b *testing.B) {
	topic := deepLevels("a", 20000)
	for _, bc := range []struct{ name, filter string }{
		{"plus", deepLevels("+", 20000)},
		{"literal-hash", deepLevels("a", 19999) + "/#"},
		{"plus-hash", deepLevels("+", 19999) + "/#"},
	} {
		filter := bc.filter
		b.Run("TopicSet/"+bc.name, func(b *testing.B) {
			var set TopicSet
			set.Add(topic)
			set.Add("a/b")
			b.SetBytes(int64(len(filter)))
			b.ReportAllocs()
			for range b.N {
				n := 0
				set.Match(filter, func(string) { n++ })
				if n != 1 {
					b.Fatalf("%d matches", n)
				}
			}
		})
		b.Run("FilterIndex/"+bc.name, func(b *testing.B) {
			var idx FilterIndex[int]
			idx.Add(filter, 1)
			idx.Add("a/b", 2)
			b.SetBytes(int64(len(topic)))
			b.ReportAllocs()
			for range b.N {
				n := 0
				idx.Match(topic, func(string, int) { n++ })
				if n != 1 {
					b.Fatalf("%d matches", n)
				}
			}
		})
	}
	b.Run("Reach", func(b *testing.B) {
		r, err := NewRouter([][]string{{"a/#"}, {"b/+/c", "#"}})
		if err != nil {
			b.Fatal(err)
		}
		filter := deepLevels("+", 20000)
		b.SetBytes(int64(len(filter)))
		b.ReportAllocs()
		for range b.N {
			if got := r.Reach(filter); len(got) != 2 {
				b.Fatalf("reached %v", got)
			}
		}
	})
}
