package peatsink

import (
	"strings"
	"testing"
)

func TestCheckMirrorAs(t *testing.T) {
	for tmpl, want := range map[string]string{
		"{stream}":        "",
		"site-a.{stream}": "",
		"{node}.{stream}": "",
		"":                "empty",
		"a/{stream}":      "one topic level",
		"{topic}":         "{topic}",
		"{site}":          "unknown placeholder",
		"a+":              "wildcards",
	} {
		err := CheckMirrorAs(tmpl)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("CheckMirrorAs(%q) = %v, want %q", tmpl, err, want)
		}
	}
}

func TestTopicOf(t *testing.T) {
	if got := topicOf("{topic}", "default", "pi", "sensors/a"); got != "sensors/a" {
		t.Errorf("default template: %q", got)
	}
	if got := topicOf("{node}/{stream}/{topic}", "default", "pi", "sensors/a"); got != "pi/default/sensors/a" {
		t.Errorf("template: %q", got)
	}
}
