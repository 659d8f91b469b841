package logstore

import (
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
