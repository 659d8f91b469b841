package logstore

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfig_ValidateNamesEveryField(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig invalid: %v", err)
	}
	d := DefaultConfig()
	if len(d.Streams) != 1 || d.Streams[0].Name != "default" || d.Streams[0].Filters[0] != "#" ||
		d.Streams[0].MaxAge != 7*24*time.Hour || d.Streams[0].Durability != DurabilityFsync {
		t.Fatalf("DefaultConfig streams = %+v", d.Streams)
	}
	cfg := Config{
		Dir:               "",
		Profile:           "pi-5",
		RetentionInterval: -time.Second,
		Streams: []StreamConfig{
			{Name: "a", Filters: []string{"x/#"}},
			{Name: "a", Filters: []string{"x/#/y", "q+/r", "x/#"}, MaxAge: -1, MaxBytes: -5, Durability: "sometimes"},
			{Name: "bad/name", Filters: nil},
			{Name: "c", Filters: []string{"", "ok", "ok"}},
		},
	}
	err := cfg.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Validate = %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{
		"dir:",
		"profile: unknown storage profile \"pi-5\"",
		"retention_interval:",
		"streams[1].name: duplicate stream name \"a\"",
		"streams[1].filters[0]: topic filter \"x/#/y\": '#' must be the last level",
		"streams[1].filters[1]: topic filter \"q+/r\": '+' must occupy a whole level",
		"streams[1].filters[2]: filter \"x/#\" is also captured by streams[0].filters[0]",
		"streams[1].max_age:",
		"streams[1].max_bytes:",
		"streams[1].durability: unknown durability \"sometimes\"",
		"streams[2].name: \"bad/name\"",
		"streams[2].filters: at least one topic filter",
		"streams[3].filters[0]: empty topic filter",
		"streams[3].filters[2]: filter \"ok\" is also captured by streams[3].filters[1]",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %q\nfull error:\n%v", want, err)
		}
	}
	if _, err := Open(cfg); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Open(invalid) = %v", err)
	}
}

func TestProfile(t *testing.T) {
	if got := ProfilePiZero.MemoryLimit(); got != 128<<20 {
		t.Errorf("pi-zero memory limit %d", got)
	}
	if got := ProfilePi.MemoryLimit(); got != 256<<20 {
		t.Errorf("pi memory limit %d", got)
	}
	if got := ProfileServer.MemoryLimit(); got != 0 {
		t.Errorf("server memory limit %d", got)
	}
	if err := Profile("huge").Validate(); err == nil {
		t.Error("unknown profile validated")
	}
	if DefaultProfile().Validate() != nil {
		t.Error("default profile invalid")
	}
	// Each profile's options satisfy Badger's constraints: Open works.
	for _, p := range []Profile{ProfilePiZero, ProfilePi, ProfileServer} {
		t.Run(string(p), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Profile = p
			st := openStore(t, cfg)
			appendN(t, st.Stream("default"), 10, 10)
			if st.Profile() != p {
				t.Fatalf("Profile() = %q", st.Profile())
			}
			o := p.badgerOptions()
			if o.ValueThreshold > o.MemTableSize*15/100 {
				t.Fatalf("ValueThreshold %d above 15%% of MemTableSize %d", o.ValueThreshold, o.MemTableSize)
			}
		})
	}
}
