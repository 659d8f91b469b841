package logstore

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestMatchFilter(t *testing.T) {
	for _, tc := range []struct {
		f, topic string
		want     bool
	}{
		// MQTT 5 §4.7.1.2 and §4.7.1.3 examples.
		{"sport/tennis/player1/#", "sport/tennis/player1", true},
		{"sport/tennis/player1/#", "sport/tennis/player1/ranking", true},
		{"sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", true},
		{"sport/#", "sport", true},
		{"sport/tennis/+", "sport/tennis/player1", true},
		{"sport/tennis/+", "sport/tennis/player1/ranking", false},
		{"sport/+", "sport", false},
		{"sport/+", "sport/", true},
		{"+/+", "/finance", true},
		{"/+", "/finance", true},
		{"+", "/finance", false},
		// §4.7.2: wildcards at the first level skip '$' topics.
		{"#", "$SYS/x", false},
		{"+/monitor/Clients", "$SYS/monitor/Clients", false},
		{"$SYS/#", "$SYS/monitor/Clients", true},
		{"$SYS/monitor/+", "$SYS/monitor/Clients", true},
		{"a/+", "a/$x", true}, // '$' matters at the first level only
		// Empty levels are levels.
		{"a//b", "a//b", true},
		{"a/+/b", "a//b", true},
		{"a/b", "a//b", false},
		{"#", "/", true},
		{"+", "", true},
		{"a/#", "a", true},
		{"a/#", "ab", false},
		{"a/b", "a/b/c", false},
		{"a/b/c", "a/b", false},
	} {
		if got := MatchFilter(tc.f, tc.topic); got != tc.want {
			t.Errorf("MatchFilter(%q, %q) = %v, want %v", tc.f, tc.topic, got, tc.want)
		}
		if got := refMatch(tc.f, tc.topic); got != tc.want {
			t.Errorf("reference match(%q, %q) = %v, want %v", tc.f, tc.topic, got, tc.want)
		}
	}
}

func TestValidateFilter(t *testing.T) {
	for _, f := range []string{"#", "+", "a", "/", "a//b", "/a", "a/", "+/+/#", "$SYS/#", "a/+/b/#", "é/+", "$share/g/a"} {
		if err := ValidateFilter(f); err != nil {
			t.Errorf("ValidateFilter(%q) = %v, want nil", f, err)
		}
	}
	for f, says := range map[string]string{
		"":                         "empty",
		"a/#/b":                    "'#' must be the last level",
		"#/":                       "'#' must be the last level",
		"a#":                       "'#' must occupy a whole level",
		"a/b#":                     "'#' must occupy a whole level",
		"a+":                       "'+' must occupy a whole level",
		"a/++":                     "'+' must occupy a whole level",
		"a/\x00":                   "NUL",
		"a/\xff":                   "not valid UTF-8",
		"a/\xed\xa0\x80":           "not valid UTF-8", // a UTF-16 surrogate [MQTT-1.5.4-1]
		strings.Repeat("a", 65536): "longer than 65535",
	} {
		err := ValidateFilter(f)
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("ValidateFilter(%.20q) = %v, want an error saying %q", f, err, says)
		}
	}
}

// refMatch is the MQTT matching rule written level by level from the spec,
// as the reference MatchFilter is fuzzed against.
func refMatch(filter, topic string) bool {
	return refMatchLevels(strings.Split(filter, "/"), strings.Split(topic, "/"))
}

// refMatchLevels is refMatch on the levels of filter and topic.
func refMatchLevels(fl, tl []string) bool {
	if strings.HasPrefix(tl[0], "$") && (fl[0] == "+" || fl[0] == "#") {
		return false // [MQTT-4.7.2-1]
	}
	var rec func(fl, tl []string) bool
	rec = func(fl, tl []string) bool {
		switch {
		case len(fl) == 0:
			return len(tl) == 0
		case fl[0] == "#":
			return true // the rest, parent level included
		case len(tl) == 0:
			return false
		case fl[0] == "+" || fl[0] == tl[0]:
			return rec(fl[1:], tl[1:])
		}
		return false
	}
	return rec(fl, tl)
}

// refValidFilter is the spec's wording, character by character: '+' must
// occupy an entire level, '#' must be on its own or after a '/' and be the
// last character; a UTF-8 string of 1 to 65535 bytes without U+0000.
func refValidFilter(f string) bool {
	if len(f) == 0 || len(f) > 65535 || !utf8.ValidString(f) {
		return false
	}
	for i := 0; i < len(f); i++ {
		startsLevel := i == 0 || f[i-1] == '/'
		endsLevel := i == len(f)-1 || f[i+1] == '/'
		switch f[i] {
		case 0:
			return false
		case '+':
			if !startsLevel || !endsLevel {
				return false
			}
		case '#':
			if !startsLevel || i != len(f)-1 {
				return false
			}
		}
	}
	return true
}

// validTopic is a topic name: 1 to 65535 bytes of UTF-8 without U+0000 or
// wildcards.
func validTopic(topic string) bool {
	return topic != "" && len(topic) <= 65535 && utf8.ValidString(topic) && !strings.ContainsAny(topic, "+#\x00")
}

func FuzzMatchFilter(f *testing.F) {
	for _, s := range [][2]string{
		{"sport/tennis/player1/#", "sport/tennis/player1"},
		{"sport/+", "sport/"}, {"+/+", "/finance"}, {"+", "/finance"},
		{"#", "$SYS/x"}, {"$SYS/#", "$SYS"}, {"a//b", "a//b"}, {"a/+/#", "a/$/b"},
		{"/#", "/"}, {"+/#", "a"}, {"a/b", "a/b/c"}, {"+/+/+", "a//"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, filter, topic string) {
		got := MatchFilter(filter, topic) // never panics, whatever the input
		if ValidateFilter(filter) != nil || !validTopic(topic) {
			return
		}
		if want := refMatch(filter, topic); got != want {
			t.Fatalf("MatchFilter(%q, %q) = %v, the spec says %v", filter, topic, got, want)
		}
	})
}

func FuzzValidateFilter(f *testing.F) {
	for _, s := range []string{"#", "+", "a/#", "a/#/b", "a#", "#a", "+a", "a+/b", "a/+/+", "//", "/#", "+#", "a/\x00", "\xff", "é/+", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, filter string) {
		err := ValidateFilter(filter)
		if want := refValidFilter(filter); (err == nil) != want {
			t.Fatalf("ValidateFilter(%q) = %v, the spec says valid = %v", filter, err, want)
		}
		if err != nil {
			return
		}
		// A valid filter matches the topic made of its literals, with any
		// level for '+' and nothing for '#' (but a first level when '#' is
		// all there is).
		topic := strings.ReplaceAll(strings.TrimSuffix(filter, "/#"), "+", "x")
		switch topic {
		case "#":
			topic = "x"
		case "":
			return // "/#": its topics all start with an empty level
		}
		if !MatchFilter(filter, topic) {
			t.Fatalf("valid filter %q does not match %q", filter, topic)
		}
	})
}
