package peatsink

import (
	"strings"
	"testing"

	"github.com/peatmq/peat/edge/sink/mqttsink"
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

// A Peat sink mirrors every offset, those a source brought down from the
// same Peat too: it names no origin to skip, where an MQTT sink to the
// same address does.
func TestNew_MirrorsEchoesToo(t *testing.T) {
	u, err := New(Config{URL: "mqtt://HQ.example", ClientID: "site-a", First: func(string) uint64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	if o := u.Origin(); o != "" {
		t.Errorf("peat sink Origin = %q, want none", o)
	}
	m, err := mqttsink.New(mqttsink.Config{URL: "mqtt://HQ.example", ClientID: "site-a", Version: 5})
	if err != nil {
		t.Fatal(err)
	}
	if o := m.Origin(); o != "mqtt://hq.example:1883" {
		t.Errorf("mqtt sink Origin = %q, want mqtt://hq.example:1883", o)
	}
}
