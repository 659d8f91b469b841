package edge

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// LoadFile reads the YAML file at path over the defaults.
func LoadFile(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: read config file: %w", ErrConfig, err)
	}
	cfg, err := Parse(data)
	if err != nil {
		probs := Problems(err)
		errs := make([]error, len(probs))
		for i, p := range probs {
			errs[i] = fmt.Errorf("%w: %s: %s", ErrConfig, path, p)
		}
		return Config{}, errors.Join(errs...)
	}
	return cfg, nil
}

// Parse reads a YAML document over the defaults. Fields the document leaves
// out keep their defaults, including the fields of each stream it lists.
// Unknown fields and values of the wrong type are errors, every one of them
// reported and named by its YAML path.
func Parse(data []byte) (Config, error) {
	cfg := DefaultConfig()
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if len(root.Content) == 0 { // an empty file: all defaults
		return cfg, nil
	}
	idx := indexNodes(root.Content[0])

	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(&cfg)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		errs := make([]error, len(te.Errors))
		for i, msg := range te.Errors {
			errs[i] = fmt.Errorf("%w: %s", ErrConfig, idx.name(msg))
		}
		return Config{}, errors.Join(errs...)
	}
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}

	// A stream written in the file starts from the stream defaults, field
	// by field (yaml would leave what the file omits at zero).
	def := defaultStream("")
	for i := range cfg.Streams {
		s, p := &cfg.Streams[i], fmt.Sprintf("streams[%d]", i)
		if !idx.present[p+".retention.max_age"] {
			s.Retention.MaxAge = def.Retention.MaxAge
		}
		if !idx.present[p+".durability"] {
			s.Durability = def.Durability
		}
		if !idx.present[p+".sync_interval"] {
			s.SyncInterval = def.SyncInterval
		}
		if !idx.present[p+".linger"] {
			s.Linger = def.Linger
		}
		if !idx.present[p+".qos0_linger"] {
			s.LingerQoS0 = def.LingerQoS0
		}
	}
	applySinkDefaults(&cfg, idx.present)
	applySourceDefaults(&cfg, idx.present)
	if idx.present["mqtt.listeners"] && !idx.present["mqtt.listen"] {
		cfg.MQTT.Listen = "" // the default's; the list replaces it
	}
	return cfg, nil
}

// nodeIndex knows the YAML path of every key and value in a document, to
// turn yaml's "line 7: ..." messages into "streams[0].durability: ...".
type nodeIndex struct {
	entries []indexEntry
	present map[string]bool
}

type indexEntry struct {
	path  string
	key   *yaml.Node // nil for sequence items
	value *yaml.Node
}

func indexNodes(n *yaml.Node) *nodeIndex {
	idx := &nodeIndex{present: make(map[string]bool)}
	idx.walk("", nil, n)
	return idx
}

func (idx *nodeIndex) walk(path string, key, n *yaml.Node) {
	if path != "" {
		idx.entries = append(idx.entries, indexEntry{path: path, key: key, value: n})
		idx.present[path] = true
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			idx.walk(p, k, n.Content[i+1])
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			idx.walk(fmt.Sprintf("%s[%d]", path, i), nil, item)
		}
	}
}

var (
	reUnknownField = regexp.MustCompile(`^line (\d+): field (\S+) not found in type \S+$`)
	reWrongType    = regexp.MustCompile("^line (\\d+): cannot unmarshal (!!\\w+)(?: `(.*)`)? into (.+)$")
	reLineColumn   = regexp.MustCompile(`^line (\d+) column (\d+): (.*)$`)
)

// name rewrites one of yaml's decoding messages to lead with the field's
// YAML path; the line number stays, in parentheses.
func (idx *nodeIndex) name(msg string) string {
	if m := reUnknownField.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		for _, e := range idx.entries {
			if e.key != nil && e.key.Line == line && e.key.Value == m[2] {
				return fmt.Sprintf("%s (line %d): unknown field", e.path, line)
			}
		}
		return fmt.Sprintf("%s (line %d): unknown field", m[2], line)
	}
	if m := reWrongType.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		want := friendlyType(m[4])
		got := m[2]
		switch got {
		case "!!seq":
			got = "a list"
		case "!!map":
			got = "a mapping"
		}
		if m[3] != "" {
			got = strconv.Quote(m[3])
		}
		prefix := strings.TrimSuffix(m[3], "...")
		match := func(v *yaml.Node) bool {
			if m[3] == "" { // a mapping or a list where a scalar belongs
				return v.Kind != yaml.ScalarNode
			}
			return v.Kind == yaml.ScalarNode && strings.HasPrefix(v.Value, prefix)
		}
		if p := idx.pathAt(line, match); p != "" {
			return fmt.Sprintf("%s (line %d): want %s, got %s", p, line, want, got)
		}
		return fmt.Sprintf("line %d: want %s, got %s", line, want, got)
	}
	if m := reLineColumn.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		col, _ := strconv.Atoi(m[2])
		if p := idx.pathAt(line, func(v *yaml.Node) bool { return v.Column == col }); p != "" {
			return fmt.Sprintf("%s (line %d): %s", p, line, m[3])
		}
		return fmt.Sprintf("line %d: %s", line, m[3])
	}
	return msg
}

// pathAt is the path of the value on line whose node satisfies match; for a
// flow mapping with several keys on one line the first match wins.
func (idx *nodeIndex) pathAt(line int, match func(*yaml.Node) bool) string {
	for _, e := range idx.entries {
		if e.value.Line == line && match(e.value) {
			return e.path
		}
	}
	return ""
}

func friendlyType(goType string) string {
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case strings.HasPrefix(goType, "map["), strings.HasPrefix(goType, "edge."):
		return "a mapping"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "an integer"
	case goType == "bool":
		return "true or false"
	case goType == "string":
		return "a string"
	}
	return goType
}
