package mqtt

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseExtension(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ok := []struct {
		filter string
		want   extFilter
	}{
		{"sensors/#", extFilter{kind: extNone}},
		{"$SYS/#", extFilter{kind: extNone}},
		{"$replay/earliest/+/sensors/#", extFilter{kind: extReplay, from: position{kind: posEarliest}, inner: "sensors/#", head: "$replay/earliest/"}},
		{"$replay/latest/+/a", extFilter{kind: extReplay, from: position{kind: posLatest}, inner: "a", head: "$replay/latest/"}},
		{"$replay/1234/+/a/+/b", extFilter{kind: extReplay, from: position{kind: posOffset, offset: 1234}, inner: "a/+/b", head: "$replay/1234/"}},
		{"$replay/-15m/+/a", extFilter{kind: extReplay, from: position{kind: posTime, at: now.Add(-15 * time.Minute)}, inner: "a", head: "$replay/-15m/"}},
		{"$replay/-2h/+/a", extFilter{kind: extReplay, from: position{kind: posTime, at: now.Add(-2 * time.Hour)}, inner: "a", head: "$replay/-2h/"}},
		{"$replay/-7d/+/a", extFilter{kind: extReplay, from: position{kind: posTime, at: now.Add(-7 * 24 * time.Hour)}, inner: "a", head: "$replay/-7d/"}},
		{"$replay/-1h30m/+/a", extFilter{kind: extReplay, from: position{kind: posTime, at: now.Add(-90 * time.Minute)}, inner: "a", head: "$replay/-1h30m/"}},
		{"$replay/2026-12-01T10:00:00Z/+/#", extFilter{kind: extReplay, from: position{kind: posTime, at: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}, inner: "#", head: "$replay/2026-12-01T10:00:00Z/"}},
		{"$group/billing/+/meters/#", extFilter{kind: extGroup, group: "billing", inner: "meters/#", head: "$group/billing/"}},
		{"$offsets/billing/default", extFilter{kind: extOffsets, group: "billing", stream: "default"}},
	}
	for _, tc := range ok {
		got, err := parseExtension(tc.filter, now)
		if err != nil {
			t.Errorf("%s: %v", tc.filter, err)
			continue
		}
		if got.kind != tc.want.kind || got.inner != tc.want.inner || got.head != tc.want.head ||
			got.group != tc.want.group || got.stream != tc.want.stream ||
			got.from.kind != tc.want.from.kind || got.from.offset != tc.want.from.offset || !got.from.at.Equal(tc.want.from.at) {
			t.Errorf("%s: got %+v, want %+v", tc.filter, got, tc.want)
		}
	}

	bad := []struct{ filter, says string }{
		{"$replay/earliest", "needs $replay/<from>/+/<filter>"},
		{"$replay//+/a", "needs"},
		{"$replay/earliest/a", "must be '+'"},
		{"$replay/earliest/7/a", "must be '+'"},
		{"$replay/earliest/+", "no filter"},
		{"$replay/earliest/+/", "no filter"},
		{"$replay/soon/+/a", "want earliest, latest"},
		{"$replay/-/+/a", "bad duration"},
		{"$replay/-0s/+/a", "out of range"},
		{"$replay/-99999999d/+/a", "days"},
		{"$replay/+15m/+/a", "want earliest"},
		{"$replay/99999999999999999999/+/a", "not an offset"},
		{"$replay/earliest/+/a/#/b", "'#' must be the last level"},
		{"$replay/earliest/+/a/b+", "whole level"},
		{"$replay/earliest/+/$SYS/#", "$ topics"},
		{"$group/+/+/a", "wildcards"},
		{"$group/g", "needs $group/<name>"},
		{"$group/g/+", "no filter"},
		{"$offsets/g", "needs $offsets/<group>/<stream>"},
		{"$offsets/g/s/x", "one topic level"},
		{"$offsets/#/s", "wildcards"},
	}
	for _, tc := range bad {
		_, err := parseExtension(tc.filter, now)
		if !errors.Is(err, errExtension) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got error %v, want one saying %q", tc.filter, err, tc.says)
		}
	}
}

func TestTopicMatches(t *testing.T) {
	cases := []struct {
		f, topic string
		want     bool
	}{
		{"#", "a", true}, {"#", "a/b", true}, {"#", "$SYS/x", false},
		{"a/#", "a", true}, {"a/#", "a/b/c", true}, {"a/#", "b", false},
		{"a/+", "a/b", true}, {"a/+", "a", false}, {"a/+", "a/b/c", false},
		{"+/b", "a/b", true}, {"+/b", "$a/b", false}, {"$a/b", "$a/b", true},
		{"a/b", "a/b", true}, {"a/b", "a/c", false}, {"a/b", "a/b/c", false},
		{"+", "", true}, {"a/+/c", "a//c", true},
	}
	for _, tc := range cases {
		if got := topicMatches(tc.f, tc.topic); got != tc.want {
			t.Errorf("topicMatches(%q, %q) = %v, want %v", tc.f, tc.topic, got, tc.want)
		}
	}
}

// FuzzParseExtension checks that the parser never panics and that what it
// accepts is consistent: the delivered topic of any record matches the
// subscribed filter, and shows the offset.
func FuzzParseExtension(f *testing.F) {
	for _, s := range []string{
		"$replay/earliest/+/sensors/#", "$replay/-7d/+/a/+/b", "$replay/12/+/#",
		"$group/g/+/a", "$offsets/g/default", "$replay/2026-12-01T10:00:00+01:00/+/x",
		"$replay//+/", "$group/+/+/#", "a/b",
	} {
		f.Add(s, "sensors/a", uint64(7))
	}
	now := time.Unix(1_800_000_000, 0)
	f.Fuzz(func(t *testing.T, filter, topic string, offset uint64) {
		ext, err := parseExtension(filter, now)
		if err != nil {
			if !errors.Is(err, errExtension) {
				t.Fatalf("%q: error %v does not wrap errExtension", filter, err)
			}
			return
		}
		if ext.kind != extReplay && ext.kind != extGroup {
			return
		}
		if ext.head+"+/"+ext.inner != filter {
			t.Fatalf("%q: head %q + inner %q do not rebuild it", filter, ext.head, ext.inner)
		}
		if strings.Contains(topic, "+") || strings.Contains(topic, "#") || !topicMatches(ext.inner, topic) {
			return
		}
		x := publishExtras{head: ext.head, offset: offset}
		got := string(x.appendTopic(nil, topic))
		if !topicMatches(filter, got) {
			t.Fatalf("delivered topic %q does not match the filter %q", got, filter)
		}
	})
}

func TestFilterStreams(t *testing.T) {
	l := newMemLog(t, "default=#", "sensors=sensors/#", "power=meters/+/power", "exact=a/b")
	cases := []struct {
		filter string
		want   []string
	}{
		{"sensors/#", []string{"sensors"}},
		{"sensors/+/temp", []string{"sensors"}},
		{"sensors", []string{"sensors"}},
		{"meters/7/power", []string{"power"}},
		{"meters/+/power", []string{"power"}},
		{"meters/+/+", []string{"default", "power"}},
		{"meters/#", []string{"default", "power"}},
		{"other/#", []string{"default"}},
		{"+/b", []string{"default", "exact", "sensors"}}, // sensors/b too
		{"a/+", []string{"default", "exact"}},
		{"#", []string{"default", "exact", "power", "sensors"}},
		{"+", []string{"default", "sensors"}},
	}
	for _, tc := range cases {
		got, err := filterStreams(l, tc.filter)
		if err != nil {
			t.Errorf("%s: %v", tc.filter, err)
			continue
		}
		var names []string
		for _, s := range got {
			names = append(names, s.Name())
		}
		slices.Sort(names)
		if !slices.Equal(names, tc.want) {
			t.Errorf("filterStreams(%q) = %v, want %v", tc.filter, names, tc.want)
		}
	}
	only := newMemLog(t, "s=sensors/#")
	if got, _ := filterStreams(only, "other/#"); len(got) != 0 {
		t.Errorf("a filter no stream captures gave %d streams", len(got))
	}
}
