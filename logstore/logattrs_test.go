package logstore

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
)

// Badger's lines keep the component the node tags the store's logger with
// (component=logstore) and name Badger in a key of their own: a JSON line
// with component twice reads, in most parsers, as the last one, so a
// filter on component=logstore lost Badger's warnings.
func TestBadgerLogger_KeepsTheComponent(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(&buf, nil)).With("component", "logstore")
	badgerLogger{l}.Warningf("value log %d truncated", 7)

	if n := bytes.Count(buf.Bytes(), []byte(`"component"`)); n != 1 {
		t.Fatalf("component appears %d times in %s", n, buf.Bytes())
	}
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("decode %s: %v", buf.Bytes(), err)
	}
	if line["component"] != "logstore" || line[attrPart] != "badger" || line["msg"] != "value log 7 truncated" {
		t.Fatalf("line = %v, want component=logstore %s=badger", line, attrPart)
	}
}
