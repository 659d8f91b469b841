package edge

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/peatmq/peat/logstore"
)

// Validate reports every problem of the configuration, each as
// "yaml.path: what is wrong", joined with errors.Join; every one wraps
// ErrConfig. Fields owned by the storage and MQTT packages are checked by
// their own Validate, with the names mapped to YAML paths.
func (c Config) Validate() error {
	var probs []problem
	add := func(path, format string, args ...any) {
		probs = append(probs, problem{path, fmt.Sprintf(format, args...)})
	}

	if c.DataDir == "" {
		add("data_dir", "must not be empty")
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		add("log.level", "must be debug, info, warn or error, got %q", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		add("log.format", "must be text or json, got %q", c.Log.Format)
	}
	if c.HTTP.Listen != "" {
		if msg := checkHostPort(c.HTTP.Listen); msg != "" {
			add("http.listen", "%s", msg)
		}
	}
	if c.MQTT.Listen != "" {
		if msg := checkHostPort(c.MQTT.Listen); msg != "" {
			add("mqtt.listen", "%s", msg)
		}
	}
	c.validateListeners(add)
	if len(c.Streams) == 0 {
		add("streams", "must list at least one stream")
	}
	probs = append(probs, c.validateSinks()...)
	probs = append(probs, c.validateSources()...)
	c.validateSecurity(add)
	c.validateCluster(add)

	// The storage and MQTT packages check their own fields; a problem they
	// share with the checks above (an empty listen) is reported once.
	seen := make(map[string]bool, len(probs))
	for _, p := range probs {
		seen[p.path] = true
	}
	for _, p := range split(c.StoreConfig().Validate(), storePath) {
		if !seen[p.path] {
			probs = append(probs, p)
		}
	}
	for _, p := range split(c.BrokerConfig().Validate(), mqttPath) {
		if !seen[p.path] {
			probs = append(probs, p)
		}
	}

	errs := make([]error, len(probs))
	for i, p := range probs {
		name := p.path
		if src, ok := c.sources[p.path]; ok {
			name = fmt.Sprintf("%s (from %s)", p.path, src)
		}
		errs[i] = fmt.Errorf("%w: %s: %s", ErrConfig, name, p.msg)
	}
	return errors.Join(errs...)
}

// problem is one invalid field.
type problem struct {
	path string // YAML path
	msg  string
}

func checkHostPort(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Sprintf("%q is not host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Sprintf("%q: port must be a number from 0 to 65535", addr)
	}
	if host != "" && net.ParseIP(host) == nil && strings.ContainsAny(host, " /") {
		return fmt.Sprintf("%q: %q is not a host name or IP address", addr, host)
	}
	return ""
}

// split flattens a joined validation error of another package into
// problems; each leaf reads "field: what is wrong", and toPath maps the
// field to its YAML path.
func split(err error, toPath func(string) string) []problem {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []problem
		for _, e := range j.Unwrap() {
			if e == logstore.ErrInvalidConfig { // the sentinel beside the joined problems
				continue
			}
			out = append(out, split(e, toPath)...)
		}
		return out
	}
	msg := err.Error()
	field, rest, ok := strings.Cut(msg, ": ")
	if !ok || strings.ContainsAny(field, " \n") {
		return []problem{{toPath(""), msg}}
	}
	return []problem{{toPath(field), rest}}
}

var reStreamField = regexp.MustCompile(`^streams\[(\d+)\]\.(\w+)(.*)$`)

// storePath maps a logstore.Config field name to its YAML path.
func storePath(field string) string {
	switch field {
	case "":
		return "storage"
	case "dir", "Dir":
		return "data_dir"
	case "profile", "Profile":
		return "storage.profile"
	case "retention_interval", "RetentionInterval":
		return "storage.retention_interval"
	case "reclaim_interval", "ReclaimInterval":
		return "storage.reclaim_interval"
	case "min_free_bytes", "MinFreeBytes":
		return "storage.min_free_bytes"
	}
	if m := reStreamField.FindStringSubmatch(field); m != nil {
		switch m[2] {
		case "max_age", "MaxAge":
			return "streams[" + m[1] + "].retention.max_age" + m[3]
		case "max_bytes", "MaxBytes":
			return "streams[" + m[1] + "].retention.max_bytes" + m[3]
		}
	}
	return field
}

// mqttPath maps an mqtt.Config field name to its YAML path.
func mqttPath(field string) string {
	switch field {
	case "":
		return "mqtt"
	case "max_payload":
		return "mqtt.max_payload_bytes"
	case "buffer_size":
		return "mqtt.buffer_bytes"
	}
	return "mqtt." + field
}
