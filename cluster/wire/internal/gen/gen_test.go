package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The checked-in codec is what the generator writes from the structs as
// they are: a field added to a message without `go generate
// ./cluster/wire` fails here.
func TestGenerated_IsCurrent(t *testing.T) {
	want, err := generate("../..")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("../..", output))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("cluster/wire/%s is stale: run go generate ./cluster/wire", output)
	}
	if !bytes.HasPrefix(got, []byte("// Code generated ")) || !bytes.Contains(got, []byte(" DO NOT EDIT.\n")) {
		t.Fatalf("%s lacks the generated-code header", output)
	}
}

// A struct the generator cannot encode is refused, naming the field,
// rather than written wrong.
func TestGenerate_Refuses(t *testing.T) {
	for name, src := range map[string]string{
		"a type with no form":     "//wire:message\ntype M struct{ F float64 }",
		"an optional integer":     "//wire:message\ntype M struct{ A string; F uint64 `wire:\"opt\"` }",
		"two optional groups":     "//wire:message\ntype M struct{ A []byte `wire:\"opt\"`; B []byte `wire:\"opt\"` }",
		"an unknown tag":          "//wire:message\ntype M struct{ A []byte `wire:\"omitempty\"` }",
		"an unknown flag":         "//wire:message fast\ntype M struct{ A string }",
		"a typed compact-only":    "//wire:message typed\ntype M struct{ A [][]byte }",
		"no message in the files": "type M struct{ A string }",
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "m.go"), []byte("package wire\n\n"+src+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := generate(dir); err == nil {
				t.Fatalf("generated:\n%s", out)
			} else if name != "no message in the files" && !strings.Contains(err.Error(), "M:") {
				t.Fatalf("error %q does not name the type", err)
			}
		})
	}
}
