package edge

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

func TestConfig_Defaults(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("default config is invalid: %v", err)
	}
	if cfg.DataDir != "./data" || cfg.MQTT.Listen != "127.0.0.1:1883" || cfg.HTTP.Listen != "127.0.0.1:8080" {
		t.Errorf("defaults: data %q mqtt %q http %q, want ./data 127.0.0.1:1883 127.0.0.1:8080",
			cfg.DataDir, cfg.MQTT.Listen, cfg.HTTP.Listen)
	}
	if got, want := cfg.BrokerConfig(), mqtt.DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("BrokerConfig of the defaults = %+v, want mqtt.DefaultConfig() %+v", got, want)
	}
	sc := cfg.StoreConfig()
	if len(sc.Streams) != 1 {
		t.Fatalf("default streams = %+v, want one", sc.Streams)
	}
	s := sc.Streams[0]
	if s.Name != "default" || !reflect.DeepEqual(s.Filters, []string{"#"}) || s.Durability != logstore.DurabilityFsync ||
		s.MaxAge != 7*24*time.Hour || s.MaxBytes != 0 {
		t.Errorf("default stream = %+v, want default capturing # with fsync, 7 days", s)
	}
	if got, want := cfg.Profile(), logstore.DefaultProfile(); got != want {
		t.Errorf("Profile() with none configured = %q, want the platform default %q", got, want)
	}
}

// The documented example says it is the defaults; hold it to that.
func TestConfig_ExampleFileIsTheDefaults(t *testing.T) {
	cfg, err := LoadFile(filepath.Join("..", "configs", "peat.yaml"))
	if err != nil {
		t.Fatalf("configs/peat.yaml: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("configs/peat.yaml is invalid: %v", err)
	}
	if want := DefaultConfig(); !reflect.DeepEqual(cfg, want) {
		t.Errorf("configs/peat.yaml =\n%+v\nwant the embedded defaults\n%+v", cfg, want)
	}
}

func TestParse_OmittedFieldsKeepDefaults(t *testing.T) {
	cfg, err := Parse([]byte(`
mqtt: {listen: "0.0.0.0:1884", allow_plaintext: true}
auth: {allow_anonymous: true}
streams:
  - name: telemetry
    filters: [sensors/#]
  - name: meters
    filters: [meters/+/power]
    retention: {max_bytes: 10MiB}
    durability: interval
    qos0_linger: 0s
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.MQTT.Listen != "0.0.0.0:1884" || cfg.MQTT.Window != mqtt.DefaultWindow {
		t.Errorf("mqtt = %+v, want listen 0.0.0.0:1884 and the default window", cfg.MQTT)
	}
	if cfg.DataDir != DefaultDataDir {
		t.Errorf("data_dir = %q, want the default", cfg.DataDir)
	}
	def := defaultStream("")
	tel, met := cfg.Streams[0], cfg.Streams[1]
	if tel.Durability != "fsync" || tel.Retention != def.Retention || tel.SyncInterval != def.SyncInterval ||
		tel.Linger != def.Linger || tel.LingerQoS0 != Duration(logstore.DefaultLingerQoS0) {
		t.Errorf("stream telemetry = %+v, want default durability, retention, sync interval, lingers", tel)
	}
	if met.Durability != "interval" || met.Retention.MaxBytes != 10<<20 || met.Retention.MaxAge != def.Retention.MaxAge ||
		met.LingerQoS0 != 0 {
		t.Errorf("stream meters = %+v, want interval, 10 MiB, default max age, no QoS 0 linger", met)
	}
}

func TestParse_EmptyFileIsTheDefaults(t *testing.T) {
	for _, doc := range []string{"", "# nothing\n", "---\n"} {
		cfg, err := Parse([]byte(doc))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if !reflect.DeepEqual(cfg, DefaultConfig()) {
			t.Errorf("%q: got %+v, want the defaults", doc, cfg)
		}
	}
}

// wantProblems asserts err holds exactly one problem per want entry, in
// order, each containing its want strings.
func wantProblems(t *testing.T, err error, want ...[]string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %d problems %q", len(want), want)
	}
	if !errors.Is(err, ErrConfig) {
		t.Errorf("error %v does not wrap ErrConfig", err)
	}
	got := Problems(err)
	if len(got) != len(want) {
		t.Fatalf("got %d problems:\n  %s\nwant %d: %q", len(got), strings.Join(got, "\n  "), len(want), want)
	}
	for i, w := range want {
		for _, s := range w {
			if !strings.Contains(got[i], s) {
				t.Errorf("problem %d = %q, want it to contain %q", i, got[i], s)
			}
		}
	}
}

func TestParse_UnknownFieldsAreErrors(t *testing.T) {
	_, err := Parse([]byte(`
data_dri: /var/lib/peat
mqtt:
  windw: 3
streams:
  - name: a
    filters: ["#"]
    retention: {max_agee: 1h}
`))
	wantProblems(t, err,
		[]string{"data_dri (line 2): unknown field"},
		[]string{"mqtt.windw (line 4): unknown field"},
		[]string{"streams[0].retention.max_agee (line 8): unknown field"},
	)
}

func TestParse_WrongTypesNameTheField(t *testing.T) {
	_, err := Parse([]byte(`
mqtt:
  window: lots
  max_payload_bytes: 1XB
http: [a, b]
streams:
  - name: a
    filters: "#"
    retention: {max_bytes: 5, max_age: 7x}
    sync_interval: soon
`))
	wantProblems(t, err,
		[]string{"mqtt.window (line 3)", "want an integer", `"lots"`},
		[]string{"mqtt.max_payload_bytes (line 4)", `"1XB" is not a size`},
		[]string{"http (line 5)", "want a mapping"},
		[]string{"streams[0].filters (line 8)", "want a list"},
		[]string{"streams[0].retention.max_age (line 9)", `"7x" is not a duration`},
		[]string{"streams[0].sync_interval (line 10)", `"soon" is not a duration`},
	)
}

func TestParse_SyntaxError(t *testing.T) {
	_, err := Parse([]byte("mqtt: {listen: [\n"))
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "line") {
		t.Errorf("got %v, want an ErrConfig naming the line", err)
	}
}

func TestLoadFile_NamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte("mqtt: {window: x}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFile(path)
	wantProblems(t, err, []string{path + ": mqtt.window (line 1)"})

	_, err = LoadFile(filepath.Join(t.TempDir(), "missing.yaml"))
	wantProblems(t, err, []string{"read config file", "missing.yaml"})
}

func TestValidate_EveryProblemNamesItsField(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(c *Config)
		want   []string // path, then words of the reason
	}{
		{"data_dir", func(c *Config) { c.DataDir = "" }, []string{"data_dir: ", "empty"}},
		{"log.level", func(c *Config) { c.Log.Level = "loud" }, []string{"log.level: ", `"loud"`}},
		{"log.format", func(c *Config) { c.Log.Format = "xml" }, []string{"log.format: ", `"xml"`}},
		{"http.listen", func(c *Config) { c.HTTP.Listen = "8080" }, []string{"http.listen: ", "host:port"}},
		{"http.listen port", func(c *Config) { c.HTTP.Listen = "127.0.0.1:99999" }, []string{"http.listen: ", "port"}},
		{"mqtt.listen", func(c *Config) { c.MQTT.Listen = "" }, []string{"mqtt.listen: ", "empty"}},
		{"mqtt.listen form", func(c *Config) { c.MQTT.Listen = "localhost" }, []string{"mqtt.listen: ", "host:port"}},
		{"mqtt.window", func(c *Config) { c.MQTT.Window = 0 }, []string{"mqtt.window: ", "positive"}},
		{"mqtt.window max", func(c *Config) { c.MQTT.Window = 70000 }, []string{"mqtt.window: ", "65535"}},
		{"mqtt.send_window", func(c *Config) { c.MQTT.SendWindow = 0 }, []string{"mqtt.send_window: ", "positive"}},
		{"mqtt.send_window max", func(c *Config) { c.MQTT.SendWindow = 70000 }, []string{"mqtt.send_window: ", "65535"}},
		{"mqtt.max_payload_bytes", func(c *Config) { c.MQTT.MaxPayloadBytes = -1 }, []string{"mqtt.max_payload_bytes: "}},
		{"mqtt.queue_depth", func(c *Config) { c.MQTT.QueueDepth = 0 }, []string{"mqtt.queue_depth: "}},
		{"mqtt.buffer_bytes", func(c *Config) { c.MQTT.BufferBytes = 0 }, []string{"mqtt.buffer_bytes: "}},
		{"mqtt.group_start", func(c *Config) { c.MQTT.GroupStart = "middle" }, []string{"mqtt.group_start: ", `"middle"`, "earliest", "latest"}},
		{"storage.profile", func(c *Config) { c.Storage.Profile = "laptop" }, []string{"storage.profile: ", `"laptop"`, "pi-zero"}},
		{"storage.retention_interval", func(c *Config) { c.Storage.RetentionInterval = -1 }, []string{"storage.retention_interval: "}},
		{"streams", func(c *Config) { c.Streams = nil }, []string{"streams: ", "at least one"}},
		{"streams[0].name", func(c *Config) { c.Streams[0].Name = "a b" }, []string{"streams[0].name: "}},
		{"streams[1].name dup", func(c *Config) { c.Streams = append(c.Streams, defaultStream("default", "x/#")) }, []string{"streams[1].name: ", "duplicate"}},
		{"streams[0].filters", func(c *Config) { c.Streams[0].Filters = nil }, []string{"streams[0].filters: "}},
		{"streams[0].filters[0]", func(c *Config) { c.Streams[0].Filters = []string{"a/#/b"} }, []string{"streams[0].filters[0]: "}},
		{"streams[0].durability", func(c *Config) { c.Streams[0].Durability = "x" }, []string{"streams[0].durability: ", `"x"`, "fsync", "interval"}},
		{"streams[0].retention.max_age", func(c *Config) { c.Streams[0].Retention.MaxAge = -1 }, []string{"streams[0].retention.max_age: "}},
		{"streams[0].retention.max_bytes", func(c *Config) { c.Streams[0].Retention.MaxBytes = -1 }, []string{"streams[0].retention.max_bytes: "}},
		{"streams[0].sync_interval", func(c *Config) { c.Streams[0].SyncInterval = -1 }, []string{"streams[0].sync_interval: "}},
		{"streams[0].linger", func(c *Config) { c.Streams[0].Linger = Duration(2 * time.Second) }, []string{"streams[0].linger: ", "between 0 and 1s", "2s"}},
		{"streams[0].qos0_linger", func(c *Config) { c.Streams[0].LingerQoS0 = -1 }, []string{"streams[0].qos0_linger: "}},
	}
	all := DefaultConfig()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.mutate(&cfg)
			wantProblems(t, cfg.Validate(), tc.want)
		})
	}

	// Several problems at once: every one is reported.
	all.DataDir = ""
	all.Log.Level = "loud"
	all.MQTT.Window = 0
	all.Storage.Profile = "laptop"
	all.Streams[0].Durability = "x"
	wantProblems(t, all.Validate(),
		[]string{"data_dir: "}, []string{"log.level: "},
		[]string{"storage.profile: "}, []string{"streams[0].durability: "},
		[]string{"mqtt.window: "})
}

func TestConfig_Precedence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "peat.yaml")
	doc := "data_dir: /from/file\nmqtt: {listen: '127.0.0.1:1001'}\nhttp: {listen: '127.0.0.1:2001'}\nlog: {level: debug}\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"PEAT_DATA_DIR":    "/from/env",
		"PEAT_MQTT_LISTEN": "127.0.0.1:1002",
		"PEAT_LOG_FORMAT":  "json",
		"PEAT_UNRELATED":   "x",
	}
	cfg.ApplyEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err := cfg.Set("data_dir", "/from/flag", "flag --data"); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	got := [][2]string{
		{cfg.DataDir, "/from/flag"},         // flag over env over file
		{cfg.MQTT.Listen, "127.0.0.1:1002"}, // env over file
		{cfg.HTTP.Listen, "127.0.0.1:2001"}, // file over defaults
		{cfg.Log.Level, "debug"},            // file
		{cfg.Log.Format, "json"},            // env over defaults
	}
	for i, g := range got {
		if g[0] != g[1] {
			t.Errorf("value %d = %q, want %q", i, g[0], g[1])
		}
	}
	if err := cfg.Set("streams", "x", "flag --streams"); !errors.Is(err, ErrConfig) {
		t.Errorf("Set of a path that cannot be overridden: %v, want ErrConfig", err)
	}
}

func TestValidate_SaysWhereAValueCameFrom(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ApplyEnv(func(k string) (string, bool) {
		if k == "PEAT_LOG_LEVEL" {
			return "loud", true
		}
		return "", false
	})
	base := cfg
	if err := cfg.Set("mqtt.listen", "nope", "flag --mqtt"); err != nil {
		t.Fatal(err)
	}
	wantProblems(t, cfg.Validate(),
		[]string{`log.level (from PEAT_LOG_LEVEL): `, `"loud"`},
		[]string{`mqtt.listen (from flag --mqtt): `, `"nope"`})
	// The copy taken before Set does not see the flag's source.
	base.MQTT.Listen = "nope"
	if p := Problems(base.Validate()); len(p) != 2 || strings.Contains(p[1], "flag") {
		t.Errorf("copy's problems %q: a Set on one copy leaked into another", p)
	}
}

func TestParseDuration(t *testing.T) {
	good := map[string]time.Duration{"0": 0, "100ms": 100 * time.Millisecond, "168h": 168 * time.Hour, "7d": 7 * 24 * time.Hour, "1.5d": 36 * time.Hour}
	for s, want := range good {
		if got, err := ParseDuration(s); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v, want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "7", "d", "-1d", "7x", "1e300d"} {
		if got, err := ParseDuration(s); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", s, got)
		}
	}
	if s := Duration(7 * 24 * time.Hour).String(); s != "7d" {
		t.Errorf("7 days prints as %q", s)
	}
}

func TestParseByteSize(t *testing.T) {
	good := map[string]int64{"0": 0, "-1": -1, "1048576": 1 << 20, "1MiB": 1 << 20, "2 KiB": 2048, "10GB": 10e9, "5B": 5}
	for s, want := range good {
		if got, err := ParseByteSize(s); err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %v, %v, want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "MiB", "-1MiB", "1XB", "1.5MiB", "99999999999TiB"} {
		if got, err := ParseByteSize(s); err == nil {
			t.Errorf("ParseByteSize(%q) = %v, want an error", s, got)
		}
	}
}

func TestParse_MappedLimitReachesTheStore(t *testing.T) {
	for yaml, want := range map[string]int64{
		`storage: {mapped_limit: 16MiB}`: 16 << 20,
		`storage: {mapped_limit: -1}`:    -1,
		`storage: {}`:                    0, // the profile's
	} {
		cfg, err := Parse([]byte(yaml))
		if err != nil {
			t.Fatalf("%s: %v", yaml, err)
		}
		if got := cfg.StoreConfig().MappedLimit; got != want {
			t.Errorf("%s: store MappedLimit %d, want %d", yaml, got, want)
		}
	}
}
