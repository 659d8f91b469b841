package edge

import (
	"fmt"
	"maps"
	"sort"
)

// Override is a configuration value that can be set from the environment or
// a command-line flag, by its YAML path.
type Override struct {
	Path string // YAML path, e.g. "mqtt.listen"
	Env  string // environment variable, e.g. "PEAT_MQTT_LISTEN"
	set  func(c *Config, v string)
}

// Overrides lists every value the environment can set, in a fixed order.
var Overrides = []Override{
	{"data_dir", "PEAT_DATA_DIR", func(c *Config, v string) { c.DataDir = v }},
	// The first MQTT listener's: mqtt.listen, or mqtt.listeners[0].listen.
	{"mqtt.listen", "PEAT_MQTT_LISTEN", func(c *Config, v string) { c.setListen(v) }},
	{"http.listen", "PEAT_HTTP_LISTEN", func(c *Config, v string) { c.HTTP.Listen = v }},
	{"storage.profile", "PEAT_STORAGE_PROFILE", func(c *Config, v string) { c.Storage.Profile = v }},
	{"log.level", "PEAT_LOG_LEVEL", func(c *Config, v string) { c.Log.Level = v }},
	{"log.format", "PEAT_LOG_FORMAT", func(c *Config, v string) { c.Log.Format = v }},
}

// ApplyEnv sets every value whose environment variable lookup finds (pass
// os.LookupEnv). A variable that is set but empty counts as set.
func (c *Config) ApplyEnv(lookup func(string) (string, bool)) {
	for _, o := range Overrides {
		if v, ok := lookup(o.Env); ok {
			o.set(c, v)
			c.setSource(c.sourcePath(o.Path), o.Env)
		}
	}
}

// Set sets the value at a YAML path listed in Overrides; source says where
// it came from ("flag --mqtt") for validation messages.
func (c *Config) Set(path, value, source string) error {
	for _, o := range Overrides {
		if o.Path == path {
			o.set(c, value)
			c.setSource(c.sourcePath(path), source)
			return nil
		}
	}
	paths := make([]string, len(Overrides))
	for i, o := range Overrides {
		paths[i] = o.Path
	}
	sort.Strings(paths)
	return fmt.Errorf("%w: %s cannot be overridden (only %v)", ErrConfig, path, paths)
}

// sourcePath is the YAML path an override of path set: mqtt.listen is
// the first listener's address.
func (c *Config) sourcePath(path string) string {
	if path == "mqtt.listen" {
		return c.listenPath()
	}
	return path
}

// setSource records where the value at path came from.
func (c *Config) setSource(path, source string) {
	m := make(map[string]string, len(c.sources)+1) // copies of a Config must not share it
	maps.Copy(m, c.sources)
	m[path] = source
	c.sources = m
}
