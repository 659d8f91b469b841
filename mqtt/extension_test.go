package mqtt

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
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
		{"$share/g/$replay/earliest/+/a", "$replay cannot be a shared subscription"},
		{"$SHARE/g/$group/n/+/#", "$group cannot be a shared subscription"},
		{"$Share/g/$offsets/n/s", "$offsets cannot be a shared subscription"},
	}
	for _, tc := range bad {
		_, err := parseExtension(tc.filter, now)
		if !errors.Is(err, errExtension) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got error %v, want one saying %q", tc.filter, err, tc.says)
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
		if strings.Contains(topic, "+") || strings.Contains(topic, "#") || !logstore.MatchFilter(ext.inner, topic) {
			return
		}
		x := publishExtras{head: ext.head, offset: offset}
		got := string(x.appendTopic(nil, topic))
		if !logstore.MatchFilter(filter, got) {
			t.Fatalf("delivered topic %q does not match the filter %q", got, filter)
		}
	})
}

func TestStreamsReached(t *testing.T) {
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
		{"+/b", []string{"default", "sensors", "exact"}}, // sensors/b too
		{"a/+", []string{"default", "exact"}},
		{"#", []string{"default", "sensors", "power", "exact"}},
		{"+", []string{"default", "sensors"}},
	}
	for _, tc := range cases {
		got, err := streamsReached(l, tc.filter)
		if err != nil {
			t.Errorf("%s: %v", tc.filter, err)
			continue
		}
		if names := streamNames(got); !slices.Equal(names, tc.want) {
			t.Errorf("streamsReached(%q) = %v, want %v", tc.filter, streamNames(got), tc.want)
		}
	}
	only := newMemLog(t, "s=sensors/#")
	if got, _ := streamsReached(only, "other/#"); len(got) != 0 {
		t.Errorf("a filter no stream captures gave %d streams", len(got))
	}
}

// A shared subscription ($share/<name>/...) to an extension topic is
// refused: mochi would grant it, and it would never deliver anything.
func TestReplay_SharedExtensionFilterIsRefused(t *testing.T) {
	b := newTestBroker(t, newMemLog(t, "default=#"))
	const filter = "$share/g/$replay/earliest/+/a"
	v5 := dialRaw(t, b, "v5", 5)
	if ack := v5.TrySubscribe(filter, 1); ack.ReasonCodes[0] != subackInvalid ||
		!strings.Contains(ack.Properties.ReasonString, "cannot be a shared subscription") {
		t.Errorf("v5: SUBACK %#x %q, want %#x saying it cannot be shared", ack.ReasonCodes[0], ack.Properties.ReasonString, subackInvalid)
	}
	if ack := dialRaw(t, b, "v3", 4).TrySubscribe(filter, 1); ack.ReasonCodes[0] != 0x80 {
		t.Errorf("v3: SUBACK %#x, want 0x80", ack.ReasonCodes[0])
	}
	// An ordinary shared subscription is mochi's, and granted.
	if ack := v5.TrySubscribe("$share/g/a/#", 1); ack.ReasonCodes[0] != 1 {
		t.Errorf("$share/g/a/#: SUBACK %#x %q, want QoS 1", ack.ReasonCodes[0], ack.Properties.ReasonString)
	}
}

// A replay of a filter that one stream captures is granted however many
// other streams there are: which streams a filter reaches is computed from
// the filters, not by routing made-up topics (the old way gave up after
// 50,000 of them and refused the subscription).
func TestReplay_ManyStreamsStillGrantOneStreamsFilter(t *testing.T) {
	specs := []string{"meters=meters/#"}
	for i := range 40 {
		specs = append(specs, fmt.Sprintf("site%d=site%d/hall%d/room%d/temp%d", i, i, i, i, i))
	}
	l := newMemLog(t, specs...)
	store(t, l.stream(t, "meters"), topicsN("meters/a/b", 0, 2), nil)
	b := newTestBroker(t, l)
	c := dialRaw(t, b, "many", 5)
	ack := c.TrySubscribe("$replay/earliest/+/meters/+/+/+", 1)
	if ack.ReasonCodes[0] != 1 {
		t.Fatalf("SUBACK %#x %q, want QoS 1 granted", ack.ReasonCodes[0], ack.Properties.ReasonString)
	}
	for i, pk := range readPublishes(t, c, 2) {
		if want := fmt.Sprintf("$replay/earliest/%d/meters/a/b/%d", i, i); pk.TopicName != want {
			t.Errorf("delivery %d: topic %q, want %q", i, pk.TopicName, want)
		}
	}
	// A filter that does span two of them is still refused, and says so.
	ack = c.TrySubscribe("$replay/earliest/+/+/hall3/room3/temp3", 1)
	if ack.ReasonCodes[0] != subackNotAccepted || !strings.Contains(ack.Properties.ReasonString, "spans streams") {
		t.Errorf("SUBACK %#x %q, want %#x saying it spans streams", ack.ReasonCodes[0], ack.Properties.ReasonString, subackNotAccepted)
	}
}

// memLog routes as the store does: a literal first level beats '+' however
// many literals follow it, so "+/x/y" spans both streams below.
func TestStreamsReached_PrecedenceAsTheStore(t *testing.T) {
	l := newMemLog(t, "wide=+/x/y", "narrow=n/#")
	if got := l.Route("n/x/y"); got == nil || got.Name() != "narrow" {
		t.Fatalf("Route(n/x/y) = %v, want narrow", streamNames([]Stream{got}))
	}
	got, err := streamsReached(l, "+/x/y")
	if names := streamNames(got); err != nil || !slices.Equal(names, []string{"wide", "narrow"}) {
		t.Fatalf("streamsReached(+/x/y) = %v, %v, want wide and narrow", names, err)
	}
}

// streamNames names streams, "<nil>" for a nil one.
func streamNames(ss []Stream) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = "<nil>"
		if s != nil {
			out[i] = s.Name()
		}
	}
	return out
}
