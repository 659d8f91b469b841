package logstore

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestStore_RouteMostSpecificFilterWins(t *testing.T) {
	cfg := testConfig(t,
		StreamConfig{Name: "all", Filters: []string{"#"}},
		StreamConfig{Name: "sensors", Filters: []string{"sensors/#"}},
		StreamConfig{Name: "power", Filters: []string{"sensors/+/power"}},
		StreamConfig{Name: "kitchen", Filters: []string{"sensors/kitchen/+"}},
		StreamConfig{Name: "exact", Filters: []string{"sensors/kitchen"}},
		StreamConfig{Name: "plushash", Filters: []string{"+/x/#"}},
		StreamConfig{Name: "sys", Filters: []string{"$SYS/#"}},
	)
	cfg.InMemory, cfg.Dir = true, ""
	st := openStore(t, cfg)
	for _, tc := range []struct{ topic, want string }{
		{"other", "all"},
		{"a/b/c", "all"},
		{"sensors", "sensors"}, // "sensors/#" matches its parent level
		{"sensors/x", "sensors"},
		{"sensors/x/power", "power"},         // '+' beats '#'
		{"sensors/kitchen/power", "kitchen"}, // literal "kitchen" beats '+' at level 2
		{"sensors/kitchen/temp", "kitchen"},
		{"sensors/kitchen", "exact"}, // ending at the last level beats '/#'
		{"sensors/kitchen/a/b", "sensors"},
		{"y/x", "plushash"},
		{"y/x/z", "plushash"},
		{"sensors/x/z", "sensors"}, // literal first level beats '+'
		{"$SYS/broker/uptime", "sys"},
		{"$other/topic", ""}, // top-level wildcards skip '$' topics
		{"", ""},
	} {
		got := st.Route(tc.topic)
		name := ""
		if got != nil {
			name = got.Name()
		}
		if name != tc.want {
			t.Errorf("Route(%q) = %q, want %q", tc.topic, name, tc.want)
		}
	}
}

func TestStore_RouteNoCatchAll(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "a", Filters: []string{"a/+", "b"}})
	cfg.InMemory, cfg.Dir = true, ""
	st := openStore(t, cfg)
	for topic, want := range map[string]bool{"a/1": true, "b": true, "a": false, "a/1/2": false, "c": false, "b/c": false} {
		if got := st.Route(topic) != nil; got != want {
			t.Errorf("Route(%q) captured = %v, want %v", topic, got, want)
		}
	}
}

func BenchmarkRoute(b *testing.B) {
	cfg := testConfig(b,
		StreamConfig{Name: "all", Filters: []string{"#"}},
		StreamConfig{Name: "sensors", Filters: []string{"sensors/#"}},
		StreamConfig{Name: "power", Filters: []string{"sensors/+/power"}})
	cfg.InMemory, cfg.Dir = true, ""
	st := openStore(b, cfg)
	b.ReportAllocs()
	for b.Loop() {
		if st.Route("sensors/kitchen/power") == nil {
			b.Fatal("no route")
		}
	}
}

func TestRouter_Reach(t *testing.T) {
	streams := []string{"default", "sensors", "power", "exact", "wide", "narrow", "sys"}
	r, err := NewRouter([][]string{
		{"#"}, {"sensors/#"}, {"meters/+/power"}, {"a/b"}, {"+/x/y"}, {"n/#"}, {"$SYS/#"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		filter string
		want   []string
	}{
		{"sensors/#", []string{"sensors"}},
		{"sensors/+/temp", []string{"sensors"}},
		{"sensors", []string{"sensors"}}, // "sensors/#" matches its parent
		{"meters/7/power", []string{"power"}},
		{"meters/+/power", []string{"power"}},
		{"meters/+/+", []string{"default", "power", "wide"}}, // meters/x/y
		{"meters/#", []string{"default", "power", "wide"}},
		{"other/#", []string{"default", "wide"}},
		{"+/b", []string{"default", "sensors", "exact", "narrow"}}, // sensors/b, n/b too
		{"a/+", []string{"default", "exact"}},
		{"+", []string{"default", "sensors", "narrow"}},
		{"o/+", []string{"default"}},
		// "n/x/y" goes to narrow and "sensors/x/y" to sensors (a literal
		// first level beats '+'), any other first level to wide.
		{"+/x/y", []string{"sensors", "wide", "narrow"}},
		{"n/x/y", []string{"narrow"}},
		{"q/x/y", []string{"wide"}},
		{"q/x/+", []string{"default", "wide"}},
		// '$' topics: only a filter naming the '$' level reaches them.
		{"#", []string{"default", "sensors", "power", "exact", "wide", "narrow"}},
		{"$SYS/+", []string{"sys"}},
		{"$other/#", nil},
	} {
		var got []string
		for _, i := range r.Reach(tc.filter) {
			got = append(got, streams[i])
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("Reach(%q) = %v, want %v", tc.filter, got, tc.want)
		}
	}
}

func TestNewRouter_RefusesBadFilters(t *testing.T) {
	for _, tc := range []struct {
		filters [][]string
		says    string
	}{
		{[][]string{{"a/#/b"}}, "'#' must be the last level"},
		{[][]string{{"a"}, {""}}, "stream 1: empty topic filter"},
		{[][]string{{"a/+", "b"}, {"c", "a/+"}}, `"a/+" belongs to streams 0 and 1`},
	} {
		if _, err := NewRouter(tc.filters); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("NewRouter(%q) = %v, want an error saying %q", tc.filters, err, tc.says)
		}
	}
	if _, err := NewRouter([][]string{{"a", "a"}}); err != nil {
		t.Errorf("a filter repeated in one stream: %v", err)
	}
}

func TestStore_Reach(t *testing.T) {
	cfg := testConfig(t,
		StreamConfig{Name: "all", Filters: []string{"#"}},
		StreamConfig{Name: "sensors", Filters: []string{"sensors/#"}},
		StreamConfig{Name: "power", Filters: []string{"sensors/+/power"}})
	cfg.InMemory, cfg.Dir = true, ""
	st := openStore(t, cfg)
	for filter, want := range map[string][]string{
		"sensors/+/+":     {"sensors", "power"},
		"sensors/a/power": {"power"},
		"+/a":             {"all", "sensors"},
	} {
		var got []string
		for _, s := range st.Reach(filter) {
			got = append(got, s.Name())
		}
		if !slices.Equal(got, want) {
			t.Errorf("Reach(%q) = %v, want %v", filter, got, want)
		}
	}
}

// reachLevels are the levels FuzzRouter_Reach builds filters from, and
// reachTopicLevels the levels of the topics it tries: the same plus "c",
// a level no filter names.
var (
	reachLevels      = []string{"a", "b", "$x", "", "+", "#"}
	reachTopicLevels = []string{"a", "b", "$x", "", "c"}
)

const (
	reachEndFilter = 6 // token: the next filter starts
	reachEndStream = 7 // token: the next stream starts
	reachMaxLevels = 3
)

// decodeRouting reads a subscription filter and stream filter sets from
// fuzz bytes: each byte mod 8 is a level of reachLevels, or ends a filter,
// or ends a stream. The first filter is the subscription. Filters keep at
// most reachMaxLevels levels and end at '#'; a filter already owned by an
// earlier stream, and invalid ones, are dropped.
func decodeRouting(data []byte) (filter string, streams [][]string) {
	var levels []string
	done := false // the filter ended at '#' or reachMaxLevels
	owner := map[string]int{}
	first := true
	streams = [][]string{nil}
	endFilter := func() {
		f := strings.Join(levels, "/")
		levels, done = levels[:0], false
		switch {
		case first:
			filter, first = f, false
		case ValidateFilter(f) != nil:
		default:
			if i, ok := owner[f]; ok && i != len(streams)-1 {
				return
			}
			owner[f] = len(streams) - 1
			streams[len(streams)-1] = append(streams[len(streams)-1], f)
		}
	}
	for _, b := range data {
		switch tok := int(b % 8); {
		case tok == reachEndFilter:
			endFilter()
		case tok == reachEndStream:
			endFilter()
			if len(streams) < 5 {
				streams = append(streams, nil)
			}
		case !done:
			levels = append(levels, reachLevels[tok])
			done = reachLevels[tok] == "#" || len(levels) == reachMaxLevels
		}
	}
	if len(levels) > 0 {
		endFilter()
	}
	return filter, streams
}

// encodeRouting is decodeRouting's inverse, for readable seeds.
func encodeRouting(filter string, streams ...[]string) []byte {
	var out []byte
	put := func(f string) {
		for _, l := range strings.Split(f, "/") {
			out = append(out, byte(slices.Index(reachLevels, l)))
		}
	}
	put(filter)
	for i, fs := range streams {
		if i > 0 {
			out = append(out, reachEndStream)
		} else {
			out = append(out, reachEndFilter)
		}
		for j, f := range fs {
			if j > 0 {
				out = append(out, reachEndFilter)
			}
			put(f)
		}
	}
	return out
}

// refMoreSpecific is the precedence rule as the docs state it: level by
// level, a literal beats '+' beats '#', and a filter ending at the topic's
// last level beats one going on with '#'. a and b match one topic.
func refMoreSpecific(a, b string) bool {
	al, bl := strings.Split(a, "/"), strings.Split(b, "/")
	rank := func(ls []string, i int) int {
		switch {
		case i == len(ls):
			return 2 // ended (a matching filter ends at the topic's end)
		case ls[i] == "+":
			return 1
		case ls[i] == "#":
			return 3
		}
		return 0
	}
	for i := 0; ; i++ {
		if ra, rb := rank(al, i), rank(bl, i); ra != rb {
			return ra < rb
		} else if ra >= 2 {
			return false // equal filters
		}
	}
}

// refRoute routes a topic, given as its levels, by trying every filter:
// the stream of the most specific match, or -1. levels[i][j] are the
// levels of streams[i][j].
func refRoute(streams [][]string, levels [][][]string, topic []string) int {
	best, bestFilter := -1, ""
	for i, fs := range streams {
		for j, f := range fs {
			if refMatchLevels(levels[i][j], topic) && (best < 0 || refMoreSpecific(f, bestFilter)) {
				best, bestFilter = i, f
			}
		}
	}
	return best
}

// FuzzRouter_Reach checks Route against refRoute and Reach against brute
// force: every topic of up to 5 levels from reachTopicLevels (filters have
// at most 3, so longer topics route like 5-level ones, and "c" stands for
// every level no filter names).
func FuzzRouter_Reach(f *testing.F) {
	for _, seed := range [][]byte{
		encodeRouting("+/a/b", []string{"#"}, []string{"a/#"}, []string{"+/a/+"}),
		encodeRouting("#", []string{"a/b"}, []string{"$x/#"}, []string{"+/+"}),
		encodeRouting("a/#", []string{"a"}, []string{"a/+/#"}, []string{"+/b"}),
		encodeRouting("+", []string{"a/#"}, []string{"+/#", "a/+"}),
		encodeRouting("$x/+", []string{"#"}, []string{"+/+"}, []string{"$x/a"}),
		encodeRouting("/+", []string{"+/"}, []string{"/#"}, []string{"//"}),
		encodeRouting("+/+/+", []string{"+/b/#"}, []string{"a/#"}, []string{"+/+/b"}, []string{"#"}),
	} {
		f.Add(seed)
	}
	var topics []string
	var gen func(prefix string, depth int)
	gen = func(prefix string, depth int) {
		for _, l := range reachTopicLevels {
			t := l
			if depth > 0 {
				t = prefix + "/" + l
			}
			if t != "" {
				topics = append(topics, t)
			}
			if depth < 4 {
				gen(t, depth+1)
			}
		}
	}
	gen("", 0)
	topicLevels := make([][]string, len(topics))
	for i, topic := range topics {
		topicLevels[i] = strings.Split(topic, "/")
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		filter, streams := decodeRouting(data)
		if ValidateFilter(filter) != nil {
			return
		}
		r, err := NewRouter(streams)
		if err != nil {
			t.Fatalf("NewRouter(%q): %v", streams, err)
		}
		levels := make([][][]string, len(streams))
		for i, fs := range streams {
			for _, f := range fs {
				levels[i] = append(levels[i], strings.Split(f, "/"))
			}
		}
		flevels := strings.Split(filter, "/")
		reached := map[int]bool{}
		for k, topic := range topics {
			want := refRoute(streams, levels, topicLevels[k])
			if got := r.Route(topic); got != want {
				t.Fatalf("streams %q: Route(%q) = %d, want %d", streams, topic, got, want)
			}
			if want >= 0 && refMatchLevels(flevels, topicLevels[k]) {
				reached[want] = true
			}
		}
		var want []int
		for i := range streams {
			if reached[i] {
				want = append(want, i)
			}
		}
		if got := r.Reach(filter); !slices.Equal(got, want) {
			t.Fatalf("streams %q: Reach(%q) = %v, want %v", streams, filter, got, want)
		}
	})
}

func BenchmarkReach(b *testing.B) {
	filters := make([][]string, 100)
	for i := range filters {
		filters[i] = []string{fmt.Sprintf("site/%d/+/power", i), fmt.Sprintf("site/%d/#", i)}
	}
	r, err := NewRouter(filters)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(r.Reach("site/+/meter/power")) != 100 {
			b.Fatal("wrong reach")
		}
	}
}
